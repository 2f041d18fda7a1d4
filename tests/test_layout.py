"""The code layout issue 12 set up, kept: test helpers live in testing/, no test module imports another, and every
free port comes from testing.net."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from rigstack.versions import REPO_ROOT

TESTS = sorted((REPO_ROOT / "tests").rglob("*.py"))


def _imported_modules(path: Path) -> list[str]:
    tree = ast.parse(path.read_text())
    found = [node.module or "" for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)]
    return found + [alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names]


def test_no_test_imports_a_test_module_or_a_helper_by_sys_path() -> None:
    # tests/kernels is its own pytest session and also runs as plain scripts on a GPU host: its loaders stay there.
    wrong = [f"{path.relative_to(REPO_ROOT)}: {module}" for path in TESTS if "kernels" not in path.parts
             for module in _imported_modules(path)
             if module.startswith("tests.") or module in ("pf_support", "helpers", "fixtures_server", "conftest")]
    assert not wrong, wrong


def test_free_port_is_defined_once() -> None:
    places = [path.relative_to(REPO_ROOT) for path in [*TESTS, *(REPO_ROOT / "testing").rglob("*.py")]
              if re.search(r"^def _?free_port\(", path.read_text(), re.MULTILINE)]
    assert places == [Path("testing/net.py")], places


# Issue 12 item 5: library functions return data (or report events to a callable the command passes in); only the
# rendering modules, the commands and the top-level wrapper write to the terminal.
RENDERERS = ("rigstack/output/", "rigstack/commands/", "rigstack/cli.py", "rigstack/main.py")


def _print_calls(path: Path) -> list[int]:
    """Lines that call print(...) or SOMETHING.print(...) (a rich console, however it is named)."""
    return [node.lineno for node in ast.walk(ast.parse(path.read_text())) if isinstance(node, ast.Call)
            and (isinstance(node.func, ast.Name) and node.func.id == "print"
                 or isinstance(node.func, ast.Attribute) and node.func.attr == "print")]


def test_only_the_rendering_modules_print() -> None:
    library = [path for path in sorted((REPO_ROOT / "rigstack").rglob("*.py"))
               if not str(path.relative_to(REPO_ROOT)).startswith(RENDERERS)]
    wrong = [f"{path.relative_to(REPO_ROOT)}:{line}" for path in library for line in _print_calls(path)]
    assert not wrong, wrong
