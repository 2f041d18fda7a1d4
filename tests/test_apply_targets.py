"""One target, however it is reached, and a read-only one named before any work (issue 28 items 4 and 5): real apply
processes, a real symlink, real bind mounts (a read-only one where mounting is allowed, else write bits taken away
from a user they bind: testing.mounts). Each test failed on the code before its fix."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

import pytest

from rigstack import applier
from rigstack.gitrepo import state_dir_for
from rigstack.stamp import read_stamp
from testing.cli import one_line_error, run_apply
from testing.hooks import hooked_apply
from testing.mounts import mounted, read_only

SCHED = "v1/core/sched/scheduler.py"


def _files(package: Path) -> dict[str, bytes]:
    return {str(p.relative_to(package)): p.read_bytes() for p in sorted(package.rglob("*")) if p.is_file()}


@contextmanager
def _paused_apply(package: Path, patches: Path) -> Iterator[subprocess.Popen]:
    """A real apply through `package`, holding its lock, paused before it applies anything."""
    run = hooked_apply("pause-before-series", "apply", "--from", f"dir:{package}", "--patches", str(patches),
                       stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        assert run.stdout.readline().strip() == "paused", run.stderr.read()
        yield run
    finally:
        if run.poll() is None:
            run.stdin.write("\n")
            run.stdin.flush()
        run.communicate(timeout=300)


@pytest.mark.parametrize("reach", ["symlink", "bind mount"])
def test_one_package_through_two_paths_is_one_target(cpu_package: Path, two_patches: Path, tmp_path: Path,
                                                    reach: str) -> None:
    """Item 4: two applies on one package through two paths both ran: the lock was per path."""
    other = tmp_path / "other" / "vllm"
    with ExitStack() as reached:
        if reach == "symlink":
            other.parent.mkdir()
            other.symlink_to(cpu_package)
        else:
            reached.enter_context(mounted(other, "--bind", str(cpu_package)))
        with _paused_apply(cpu_package, two_patches) as first:
            second = run_apply("apply", "--from", f"dir:{other}", "--patches", str(two_patches))
            assert second.returncode == 1, second.stderr
            assert f"another apply (pid {first.pid}) is working on" in one_line_error(second)
        assert first.returncode == 0, first.stderr
        assert read_stamp(cpu_package).patch_ids == ("0001", "0002")
        assert not state_dir_for(other).exists(), "the second run left no state folder of its own"
        if reach == "symlink":  # the real path names the state folder, so a symlink reaches the same one
            again = run_apply("apply", "--from", f"dir:{other}", "--patches", str(two_patches))
            assert again.returncode == 0 and "nothing to do" in again.stderr, again.stderr


def test_a_read_only_package_with_a_writable_state_folder_is_named(tmp_path: Path, two_patches: Path) -> None:
    """Item 5: a wheel's package made read-only (`mount --bind -o ro`) beside a writable state folder failed
    mid-checkout with git's message and left the journal."""
    out = tmp_path / "out"
    first = run_apply("apply", "--from", "wheel:cpu", "--out", str(out), "--patches", str(two_patches),
                      "--until", "0001")
    assert first.returncode == 0, first.stderr
    package, state = out / "vllm", state_dir_for(out / "vllm")
    before, history = _files(package), _files(state)
    with read_only(package):
        refused = run_apply("apply", "--from", "wheel:cpu", "--out", str(out), "--patches", str(two_patches))
        assert refused.returncode == 1
        assert f"{package} is not writable" in one_line_error(refused) and "nothing was changed" in refused.stderr
        assert _files(package) == before
    assert _files(state) == history and not (state / applier.JOURNAL).exists()


def test_a_read_only_folder_inside_the_package_is_named_before_the_checkout(cpu_package: Path,
                                                                            two_patches: Path) -> None:
    """Item 5: a read-only folder the stack writes into is named before the journal, not met by git half way."""
    assert run_apply("apply", "--from", f"dir:{cpu_package}", "--patches", str(two_patches),
                     "--until", "0001").returncode == 0
    folder = (cpu_package / SCHED).parent
    state = state_dir_for(cpu_package)
    before = _files(cpu_package)
    with read_only(folder):
        refused = run_apply("apply", "--from", f"dir:{cpu_package}", "--patches", str(two_patches))
        assert refused.returncode == 1
        assert f"{folder} is not writable, and the stack changes files in it" in one_line_error(refused)
        assert _files(cpu_package) == before and not (state / applier.JOURNAL).exists()
    done = run_apply("apply", "--from", f"dir:{cpu_package}", "--patches", str(two_patches))
    assert done.returncode == 0 and read_stamp(cpu_package).patch_ids == ("0001", "0002"), done.stderr
