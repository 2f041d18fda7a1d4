"""The code layout issue 12 set up, kept: test helpers live in testing/, no test module imports another, and every
free port comes from testing.net."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

from rigstack.versions import REPO_ROOT

TESTS = sorted((REPO_ROOT / "tests").rglob("*.py"))


def _imported_modules(path: Path) -> list[str]:
    tree = ast.parse(path.read_text())
    found = [node.module or "" for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)]
    return found + [alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names]


def test_no_test_imports_a_test_module_or_a_helper_by_sys_path() -> None:
    # tests/kernels is its own pytest session, whose tests import its own helpers (hc_workers) by name.
    wrong = [f"{path.relative_to(REPO_ROOT)}: {module}" for path in TESTS if "kernels" not in path.parts
             for module in _imported_modules(path)
             if module.startswith("tests.") or module in ("pf_support", "helpers", "fixtures_server", "conftest")
             or module.split(".")[-1].startswith("test_")]  # a sibling test module, found through rootdir's path
    # nor loads a module by its path (importlib's spec_from_file_location): a shared harness lives in testing/
    loaded = [str(path.relative_to(REPO_ROOT)) for path in TESTS for node in ast.walk(ast.parse(path.read_text()))
              if isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "spec_from_file_location"]
    assert not wrong and not loaded, (wrong, loaded)


def test_free_port_is_defined_once() -> None:
    places = [path.relative_to(REPO_ROOT) for path in [*TESTS, *(REPO_ROOT / "testing").rglob("*.py")]
              if re.search(r"^def _?free_port\(", path.read_text(), re.MULTILINE)]
    assert places == [Path("testing/net.py")], places


# Issue 12 item 5: library functions return data (or report events to a callable the command passes in); only the
# rendering modules, the commands and the top-level wrapper write to the terminal. The rule covers every Python file
# of the checkout outside tests/ (issue 26 item 8), so a print in testing/, a shim or a script fails it too.
RENDERERS = ("rigstack/output/", "rigstack/commands/", "rigstack/cli.py", "rigstack/main.py")
# Entry points whose printing is their output, each with why it is not a renderer's. Nothing else may join this.
PRINTING_ENTRY_POINTS = {
    # GPU benches: a live sweep on a GPU host, each line flushed as it is measured (a run takes minutes and may be
    # killed part way); their figures are the README's, read from this log.
    "scripts/bench_moe_layer.py": "GPU bench, live sweep",
    # The benches' measured code, moved out of tests/kernels and scripts/ (issue 32 item 5): the same live sweeps.
    "rigstack/bench/sparse_mla.py": "GPU bench, live sweep",
    "rigstack/bench/expert_gather.py": "GPU bench, live sweep",
    "rigstack/bench/expert_prefill.py": "GPU bench, live sweep",
    "rigstack/bench/cond_copy_probe.py": "GPU probe, live lines",
    "rigstack/bench/moe_chain.py": "GPU bench, a line per point as it is timed",
    "scripts/bench_moe_chain.py": "GPU bench: the README's table from the bench's JSON is its whole output",
    "scripts/bench_apply.py": "bench: its timing lines are its whole output",
    "scripts/bench_twins.py": "bench: its table and its JSON line are its whole output",
    "scripts/make_tiny_model.py": "prints the model's folder alone, for $(...) in shell scripts",
}


def _python_files() -> list[str]:
    """Every .py file git tracks or would track here (ignored build output and venvs left out)."""
    listed = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard", "*.py"],
                            cwd=REPO_ROOT, capture_output=True, text=True, check=True).stdout.split()
    return sorted(name for name in set(listed) if (REPO_ROOT / name).is_file())


def _print_calls(path: Path) -> list[int]:
    """Lines that call print(...) or SOMETHING.print(...) (a rich console, however it is named)."""
    return [node.lineno for node in ast.walk(ast.parse(path.read_text())) if isinstance(node, ast.Call)
            and (isinstance(node.func, ast.Name) and node.func.id == "print"
                 or isinstance(node.func, ast.Attribute) and node.func.attr == "print")]


def test_only_the_rendering_modules_print() -> None:
    checked = [name for name in _python_files() if not name.startswith(("tests/", *RENDERERS))
               and name not in PRINTING_ENTRY_POINTS]
    assert "testing/net.py" in checked and "apply.py" in checked  # the scope is the checkout, not rigstack/ alone
    wrong = [f"{name}:{line}" for name in checked for line in _print_calls(REPO_ROOT / name)]
    assert not wrong, wrong


def test_every_printing_entry_point_still_prints() -> None:
    # An allowance that is no longer needed is dropped, so the list stays the exceptions it says it is.
    idle = [name for name in PRINTING_ENTRY_POINTS if not _print_calls(REPO_ROOT / name)]
    assert not idle, idle


# Issue 32: the house has floors. Entry points (the commands, the shims, `python -m` modules) stand on top, the
# rendering layer (rigstack/output/) under them, the library below; no import runs back up and none goes round.
SOURCE = sorted([*(REPO_ROOT / "rigstack").rglob("*.py"), *(REPO_ROOT / "testing").rglob("*.py"),
                 *(REPO_ROOT / "scripts").glob("*.py"), REPO_ROOT / "apply.py", REPO_ROOT / "preflight.py"])
ENTRY_POINTS = ("rigstack/commands/", "rigstack/main.py", "rigstack/cli.py")
OUTPUT = "rigstack/output/"
# GPU benches for a bare GPU host: their printed figures are their product, and the library never imports them.
BENCH = "rigstack/bench/"
BENCH_MAY_IMPORT = ("torch", "triton", "numpy", "cuda", "rigstack.bench", "rigstack.errors")
MAX_MODULE_LINES, MAX_FUNCTION_LINES = 500, 60


def _relative(path: Path) -> str:
    return str(path.relative_to(REPO_ROOT))


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO_ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


KNOWN = {_module_name(path) for path in SOURCE}


def _is_entry(path: Path) -> bool:
    return _relative(path).startswith(ENTRY_POINTS) or path.name == "__main__.py"


def _library() -> list[Path]:
    return [path for path in SOURCE if _relative(path).startswith("rigstack/") and not _is_entry(path)
            and not _relative(path).startswith((OUTPUT, BENCH))]


def _rigstack_imports(path: Path) -> list[str]:
    """Every module of this tree the file imports, at the top or inside a function, `from pkg import module` too."""
    tree = ast.parse(path.read_text())
    package = _module_name(path) if path.name == "__init__.py" else _module_name(path).rpartition(".")[0]
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[:len(package.split(".")) - node.level + 1]
                base = ".".join([*parts, *([base] if base else [])])
            # `from pkg import module` imports that module; `from module import name`, the module.
            found += [f"{base}.{alias.name}" if f"{base}.{alias.name}" in KNOWN else base for alias in node.names]
    return sorted({name for name in found if name in KNOWN})


def test_the_library_imports_neither_the_output_layer_nor_the_commands() -> None:
    wrong = [f"{_relative(path)}: {name}" for path in _library() for name in _rigstack_imports(path)
             if name.startswith(("rigstack.output", "rigstack.commands")) or name in ("rigstack.main", "rigstack.cli")]
    assert not wrong, wrong


def test_the_output_layer_imports_no_command() -> None:
    wrong = [f"{_relative(path)}: {name}" for path in SOURCE if _relative(path).startswith(OUTPUT)
             for name in _rigstack_imports(path) if name.startswith("rigstack.commands") or name == "rigstack.main"]
    assert not wrong, wrong


def test_no_two_modules_import_each_other_round_a_circle() -> None:
    graph = {_module_name(path): set(_rigstack_imports(path)) - {_module_name(path)} for path in SOURCE}
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    circles = []

    def visit(module: str, trail: list[str]) -> None:
        state[module] = 1
        for other in sorted(graph.get(module, ())):
            if state.get(other) == 1:
                circles.append(" -> ".join([*trail[trail.index(other):], other]))
            elif other not in state:
                visit(other, [*trail, other])
        state[module] = 2

    for module in sorted(graph):
        if module not in state:
            visit(module, [module])
    assert not circles, circles


def test_no_private_name_crosses_a_package() -> None:
    """A name with a leading underscore is used in its own package only (rigstack.port's modules share theirs)."""
    wrong = []
    for path in SOURCE:
        package = _module_name(path).rpartition(".")[0] if path.name != "__init__.py" else _module_name(path)
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and not node.level and (node.module or "").startswith("rigstack"):
                owner = node.module if (REPO_ROOT / node.module.replace(".", "/")).is_dir() else \
                    node.module.rpartition(".")[0]
                wrong += [f"{_relative(path)}: {node.module}.{alias.name}" for alias in node.names
                          if alias.name.startswith("_") and not alias.name.startswith("__") and owner != package]
    assert not wrong, wrong


def test_the_benches_import_only_torch_triton_and_each_other_and_the_library_none() -> None:
    wrong = [f"{_relative(path)}: {name}" for path in SOURCE if _relative(path).startswith(BENCH)
             for name in _imported_modules(path) if name and name.split(".")[0] not in sys.stdlib_module_names
             and not name.startswith(BENCH_MAY_IMPORT) and name != "__future__"]
    users = [path for path in SOURCE if not _relative(path).startswith((BENCH, "scripts/"))]
    wrong += [f"{_relative(path)}: {name}" for path in users for name in _rigstack_imports(path)
              if name.startswith("rigstack.bench")]
    assert not wrong, wrong


def test_no_script_reaches_into_the_test_tree() -> None:
    wrong = [_relative(path) for path in SOURCE if re.search(r"sys\.path\.(insert|append)\(.*tests", path.read_text())]
    assert not wrong, wrong


def test_modules_and_functions_stay_short() -> None:
    """No module over 500 lines, no function over 60: split by concern (issue 32 item 4). No allowlist."""
    long = [f"{_relative(path)}: {lines} lines" for path in SOURCE
            if (lines := len(path.read_text().splitlines())) > MAX_MODULE_LINES]
    long += [f"{_relative(path)}:{node.lineno} {node.name}: {node.end_lineno - node.lineno + 1} lines"
             for path in SOURCE for node in ast.walk(ast.parse(path.read_text()))
             if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
             and node.end_lineno - node.lineno + 1 > MAX_FUNCTION_LINES]
    assert not long, long
