"""preflight.py end to end, as a user runs it (subprocess): exit codes and the one-line messages.
The full run uses a real copy of the test interpreter's vllm package, patched with the stack by apply.py."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from testing.net import free_port

from rigstack.preflight.knowledge import find_package
from rigstack.profiles import list_profiles
from rigstack.tinymodel import build_tiny_model
from rigstack.versions import REPO_ROOT


def preflight(*args: str) -> subprocess.CompletedProcess[str]:
    # rich wraps at 80 columns when stderr is not a terminal; a wide one keeps each message on its one line.
    return subprocess.run([sys.executable, "preflight.py", *args], cwd=REPO_ROOT, capture_output=True, text=True,
                          timeout=600, env={**os.environ, "COLUMNS": "500"})


@pytest.fixture(scope="module")
def patched(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """scripts/test_env.sh patches the venv's own package and names it; elsewhere, a patched private copy."""
    if os.environ.get("RIGSTACK_PATCHED_VLLM"):
        return Path(os.environ["RIGSTACK_PATCHED_VLLM"])
    source = find_package()
    assert source is not None
    target = tmp_path_factory.mktemp("site") / "vllm"
    shutil.copytree(source, target, symlinks=True)
    done = subprocess.run([sys.executable, "apply.py", "apply", "--from", f"dir:{target}"], cwd=REPO_ROOT,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    return target


@pytest.fixture(scope="module")
def tiny() -> Path:
    return build_tiny_model("dense")


def free_profile(tmp_path: Path, extra: str = "", base: str = "cpu-tiny") -> Path:
    path = tmp_path / "mine.yaml"
    path.write_text(f"extends: {base}\nport: {free_port()}\n{extra}")
    return path


@pytest.mark.slow
def test_cpu_tiny_passes_on_a_patched_package(tmp_path: Path, patched: Path, tiny: Path) -> None:
    for base in ("cpu-tiny", "cpu-tiny-pp2"):
        done = preflight("--profile", str(free_profile(tmp_path, base=base)), "--model", str(tiny),
                         "--package", str(patched), "--json")
        report = json.loads(done.stdout)
        assert done.returncode == 0, report
        statuses = {r["check"]: r["status"] for r in report["results"]}
        assert set(statuses.values()) <= {"PASS", "SKIP"}, report
        for name in ("gpus", "model", "kv-room", "stamp", "imports", "flags", "env"):
            assert statuses[name] == "PASS", report
        assert statuses["partition"] == ("PASS" if base == "cpu-tiny-pp2" else "SKIP")


def test_exit_codes(tmp_path: Path, patched: Path, tiny: Path) -> None:
    warns = free_profile(tmp_path, "hardware:\n  host_ram_gib: 100000\n")
    common = ("--model", str(tiny), "--package", str(patched))
    assert preflight("--profile", str(warns), *common).returncode == 0
    strict = preflight("--profile", str(warns), *common, "--strict")
    assert strict.returncode == 1
    assert "WARN host-ram" in strict.stdout and "the profile was measured with 100000" in strict.stdout
    failing = preflight("--profile", str(warns), "--model", str(tmp_path / "none"), "--package", str(patched))
    assert failing.returncode == 2
    assert re.search(rf"^FAIL model +model folder {tmp_path}/none not found$", failing.stdout, re.MULTILINE)


@pytest.mark.slow
def test_unpatched_package_fails_on_the_stamp(tmp_path: Path, pristine_package: Path, tiny: Path) -> None:
    done = preflight("--profile", str(free_profile(tmp_path)), "--model", str(tiny), "--package", str(pristine_package),
                     "--json")
    report = json.loads(done.stdout)
    assert done.returncode == 2
    assert [r["check"] for r in report["results"] if r["status"] == "FAIL"] == ["stamp"], report


def test_unknown_profile_is_one_line_with_a_suggestion() -> None:
    done = preflight("--profile", "cpu-tiy")
    assert done.returncode == 1
    assert done.stderr.strip() == ("error: no profile named 'cpu-tiy'; did you mean 'cpu-tiny'? "
                                   "`python preflight.py profiles` lists them")


def test_misspelt_key_is_one_line_with_file_and_line(tmp_path: Path) -> None:
    path = tmp_path / "typo.yaml"
    path.write_text("extends: cpu-tiny\nhardware:\n  shm_gb: 1\n")
    done = preflight("--profile", str(path))
    assert done.returncode == 1
    assert done.stderr.strip() == (f"error: {path}:3: hardware.shm_gb: unknown key; did you mean 'shm_gib'?; "
                                   "fix the profile")
    assert preflight("show", str(path), "--resolved").returncode == 1


def test_profiles_lists_and_marks_fits() -> None:
    done = preflight("profiles", "--json")
    assert done.returncode == 0
    rows = {row["name"]: row for row in json.loads(done.stdout)}
    assert sorted(rows) == list_profiles()
    assert rows["cpu-tiny"]["fits"] and rows["cpu-tiny"]["gpus"] == 0
    assert rows["cmp170hx-8x-pp8"]["gpus"] == 8 and rows["rtxpro6000-tp2-replicas"]["gpus"] == 4
    table = preflight("profiles")
    assert table.returncode == 0 and "glm53-cmp170hx-pp10" in table.stdout


def test_show_resolved_merges_the_overlay() -> None:
    raw = preflight("show", "cmp170hx-6x-pp6")
    assert raw.returncode == 0 and "extends: cmp170hx-8x-pp8" in raw.stdout
    merged = preflight("show", "cmp170hx-6x-pp6", "--resolved")
    assert merged.returncode == 0 and "extends" not in merged.stdout
    from rigstack.profiles import load_profile

    six = load_profile("cmp170hx-6x-pp6").parallel.partition  # the overlay's layout, not the 8-card base's
    assert "  partition:\n" + "".join(f"  - {n}\n" for n in six) in merged.stdout
    assert "VLLM_PP_MAX_DECODE_REQS_PER_BATCH: '4'" in merged.stdout
