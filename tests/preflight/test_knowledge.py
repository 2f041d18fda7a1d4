"""vLLM knowledge extraction: which interpreter runs it, and the cache keyed by the package's files (exercised with
a small stand-in package that has vLLM's three entry points, so each run takes a second, not a minute)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from rigstack.preflight import knowledge

STAND_IN = {
    "__init__.py": "__version__ = '0.0.test'\n",
    "envs.py": "environment_variables = {'VLLM_A': None, 'VLLM_B': None}\n",
    "utils/__init__.py": "",
    "utils/argparse_utils.py": "import argparse\nFlexibleArgumentParser = argparse.ArgumentParser\n",
    "entrypoints/__init__.py": "",
    "entrypoints/common/__init__.py": "",
    "entrypoints/common/cli_args.py": (  # where vLLM 0.34.0 keeps it; an enable/disable pair as 0.34.0 makes them
        "import argparse\n"
        "def make_arg_parser(parser):\n"
        "    parser.add_argument('--max-num-seqs', type=int)\n"
        "    parser.add_argument('--kv-cache-dtype', choices=['auto', 'fp8'])\n"
        "    parser.add_argument('--enable-prefix-caching', '--disable-prefix-caching', action='store_true')\n"
        "    return parser\n"),
    "parser/__init__.py": "",
    "parser/glm47_moe.py": "",
}


@pytest.fixture
def stand_in(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("RIGSTACK_CACHE", str(tmp_path / "cache"))
    package = tmp_path / "site" / "vllm"
    for name, text in STAND_IN.items():
        (package / name).parent.mkdir(parents=True, exist_ok=True)
        (package / name).write_text(text)
    return package


def test_learns_flags_env_and_imports(stand_in: Path) -> None:
    known = knowledge.load(stand_in, ["vllm.parser.glm47_moe"])
    assert known.error is None and known.version == "0.0.test" and not known.cached
    assert known.env == frozenset({"VLLM_A", "VLLM_B"})
    assert known.imports == {"vllm.parser.glm47_moe": None}
    assert known.flags["kv-cache-dtype"] == knowledge.Flag(True, ("auto", "fp8"))
    assert known.flags["disable-prefix-caching"] == knowledge.Flag(False, None)


def test_second_run_is_cached_until_a_file_changes(stand_in: Path) -> None:
    first = knowledge.load(stand_in, [])
    again = knowledge.load(stand_in, [])
    assert again.cached and again.flags == first.flags
    envs = stand_in / "envs.py"
    envs.write_text("environment_variables = {'VLLM_C': None}\n")
    os.utime(envs, ns=(envs.stat().st_atime_ns, envs.stat().st_mtime_ns + 10**9))
    changed = knowledge.load(stand_in, [])
    assert not changed.cached and changed.env == frozenset({"VLLM_C"})


def test_broken_package_reports_and_is_not_cached(stand_in: Path, tmp_path: Path) -> None:
    (stand_in / "entrypoints" / "common" / "cli_args.py").write_text("raise ImportError('no parser here')\n")
    known = knowledge.load(stand_in, [])
    assert known.error == "ImportError: no parser here"
    assert not list((tmp_path / "cache").glob("preflight/*.json"))
    assert knowledge.load(None).error == "no vllm package found; pass --package PATH"


def test_interpreter_of_a_venv_and_of_a_plain_folder(tmp_path: Path) -> None:
    venv_pkg = tmp_path / "venv" / "lib" / "python3.11" / "site-packages" / "vllm"
    venv_pkg.mkdir(parents=True)
    (tmp_path / "venv" / "bin").mkdir()
    (tmp_path / "venv" / "bin" / "python").touch()
    assert knowledge.interpreter(venv_pkg) == (str(tmp_path / "venv" / "bin" / "python"), {})
    python, env = knowledge.interpreter(tmp_path / "site" / "vllm")
    assert python == sys.executable and env["PYTHONPATH"].split(os.pathsep)[0] == str(tmp_path / "site")


def test_module_names() -> None:
    assert knowledge.module_names(["parser/glm47_moe.py", "v1/__init__.py", "README.md", "parser/glm47_moe.py"]) == [
        "vllm.parser.glm47_moe", "vllm.v1"]
