"""Patch files that are not what they look like (issue 28 items 8-12): special files, names that disagree inside a
diff section, pure renames, the size limit's unit, a NUL in a header. Real files, real git, apply.py run as a user
runs it. Each test failed on the code before its fix."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from rigstack import applier, patched
from rigstack.baseline import parse_source
from rigstack.errors import UserError
from rigstack.gitrepo import PackageRepo
from rigstack.stack import MAX_PATCH_BYTES, load_stack
from rigstack.stamp import read_stamp
from rigstack.versions import REPO_ROOT
from testing.cli import one_line_error
from testing.patches import PatchMaker

HEADER = "Subject: s\nWhy: w\nOrigin: o\nUpstream: u\nSwitch: none\nRigs: all\nTests: t\n"
SPECIAL = {
    "dangling symlink": (lambda path: path.symlink_to(path.parent / "gone"), "a symlink to .*gone, which does not"),
    "folder": (lambda path: path.mkdir(), "a directory, not a regular file"),
    "symlink loop": (lambda path: path.symlink_to(path), "a symlink loop"),
    "FIFO": (lambda path: os.mkfifo(path), "a FIFO \\(named pipe\\), not a regular file"),
    "link to /dev/zero": (lambda path: path.symlink_to("/dev/zero"), "a character device, not a regular file"),
}


def _run(*args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    """A real process with a deadline: a FIFO used to hang it, /dev/zero to read without end."""
    try:
        return subprocess.run([sys.executable, *args], capture_output=True, text=True, cwd=REPO_ROOT, timeout=timeout,
                              env={**os.environ, "COLUMNS": "200"})
    except subprocess.TimeoutExpired:
        pytest.fail(f"{' '.join(args)} did not finish in {timeout} s")


@pytest.mark.parametrize("kind", SPECIAL)
def test_a_patch_path_must_be_a_regular_file(tmp_path: Path, kind: str) -> None:
    """Item 8: a dangling symlink, a folder or a loop ended in `bug:` (exit 3), a FIFO hung, /dev/zero read on."""
    make, message = SPECIAL[kind]
    folder = tmp_path / "patches"
    folder.mkdir()
    path = folder / "0001-special.patch"
    make(path)
    result = _run(str(REPO_ROOT / "apply.py"), "check", "--patches", str(folder))
    assert result.returncode == 1, result.stderr
    line = one_line_error(result)
    assert str(path) in line and re.search(message, line), line


@pytest.mark.parametrize("kind", ["folder", "FIFO", "link to /dev/zero", "dangling symlink"])
def test_a_profile_path_must_be_a_regular_file(tmp_path: Path, kind: str) -> None:
    """Item 8: a folder or /dev/zero as a profile read "no profile named X" (or "not found") about a file there."""
    make, message = SPECIAL[kind]
    path = tmp_path / "rig.yaml"
    make(path)
    result = _run(str(REPO_ROOT / "preflight.py"), "show", str(path))
    assert result.returncode == 1, result.stderr
    line = one_line_error(result)
    assert str(path) in line and re.search(message, line) and "not found" not in line, line


@pytest.mark.parametrize("kind", ["FIFO", "link to /dev/zero", "symlink loop"])
def test_an_import_source_must_be_a_regular_file(tmp_path: Path, kind: str) -> None:
    """Item 8: import's sources and the files a quilt series names get the same words."""
    make, message = SPECIAL[kind]
    path = tmp_path / "incoming.patch"
    make(path)
    quilt = tmp_path / "quilt"
    quilt.mkdir()
    (tmp_path / "stack").mkdir()
    (quilt / "series").write_text("named.patch\n")
    make(quilt / "named.patch")
    # A series entry that links out of its folder is refused as outside it (issue 28 item 27) before it is read.
    outside = (str(quilt / "series"), "names named.patch, which is outside")
    in_quilt = outside if kind == "link to /dev/zero" else (str(quilt / "named.patch"), message)
    for source, (named, words) in ((path, (str(path), message)), (quilt, in_quilt)):
        result = _run(str(REPO_ROOT / "apply.py"), "import", "--dry-run", "--patches", str(tmp_path / "stack"),
                      str(source))
        assert result.returncode == 1, result.stderr
        line = one_line_error(result)
        assert named in line and re.search(words, line), line


@pytest.mark.parametrize(("old", "new", "moved"), [
    ("vllm/logger.py", "vllm/envs.py", "---"),
    ("vllm/logger.py", "vllm/envs.py", "+++"),
    ("vllm/logger.py", "vllm/envs.py", "rename"),
])
def test_every_name_in_a_diff_section_must_agree(tmp_path: Path, patch_maker: PatchMaker, old: str, new: str,
                                                 moved: str) -> None:
    """Item 9: `diff --git a/vllm/logger.py b/vllm/logger.py` over ---/+++ lines naming vllm/envs.py was accepted: git
    changed envs.py while the tool believed logger.py."""
    folder = tmp_path / "patches"
    patch = patch_maker.write(folder, "0001-names.patch", patch_maker.edit("logger.py", "import ", "# x\nimport "))
    text = original = patch.read_text()
    if moved == "rename":
        text = text.replace("index ", f"similarity index 90%\nrename from {old}\nrename to {new}\nindex ", 1)
    else:
        side = "a" if moved == "---" else "b"
        text = text.replace(f"{moved} {side}/{old}", f"{moved} {side}/{new}", 1)
    patch.write_text(text)
    with pytest.raises(UserError, match="names another file than its section's `diff --git` line") as error:
        load_stack(folder)
    assert "0001-names.patch" in str(error.value)
    two_names = original.replace(f"diff --git a/{old} b/{old}", f"diff --git a/{old} b/{new}", 1)
    patch.write_text(two_names.replace(f"+++ b/{old}", f"+++ b/{new}", 1))
    with pytest.raises(UserError, match=r"names two files \(vllm/logger.py, vllm/envs.py\) and no rename"):
        load_stack(folder)


def test_a_pure_rename_applies_and_exports_byte_for_byte(cpu_package: Path, tmp_path: Path, pins) -> None:
    """Item 10: a 100% rename with no hunk, which patches/README.md documents, was refused as "not a git diff header
    line"."""
    folder = tmp_path / "patches"
    folder.mkdir()
    text = (HEADER + "---\ndiff --git a/vllm/logger.py b/vllm/logger_moved.py\nsimilarity index 100%\n"
            "rename from vllm/logger.py\nrename to vllm/logger_moved.py\n")
    (folder / "0001-move.patch").write_text(text)
    logger = (cpu_package / "logger.py").read_bytes()
    result = applier.apply_stack(parse_source(f"dir:{cpu_package}"), load_stack(folder), pins)
    assert result.error is None and [p.status for p in result.patches] == ["applied"]
    assert not (cpu_package / "logger.py").exists() and (cpu_package / "logger_moved.py").read_bytes() == logger
    assert read_stamp(cpu_package).patch_ids == ("0001",) and PackageRepo(cpu_package).dirty_files() == []
    exported = patched.export(cpu_package, tmp_path / "exported")
    assert [path.read_text() for path in exported] == [text]


def test_the_size_limit_has_one_unit_everywhere(tmp_path: Path) -> None:
    """Item 11: the limit is 4 MiB, README said "4 MB" and the message "4.2 MB is over the 4 MB limit"."""
    assert MAX_PATCH_BYTES == 4 * 1024 * 1024
    words = "4 MiB (4,194,304 bytes)"
    for readme in (REPO_ROOT / "README.md", REPO_ROOT / "patches" / "README.md"):
        text = " ".join(readme.read_text().split())  # as Markdown reads it: a line break is a space
        assert words in text and not re.search(r"\b4 ?MB\b", text), readme
    folder = tmp_path / "patches"
    folder.mkdir()
    size = 4_400_000
    body = HEADER + "---\ndiff --git a/vllm/x.py b/vllm/x.py\nnew file mode 100644\n--- /dev/null\n+++ b/vllm/x.py\n"
    (folder / "0001-huge.patch").write_text(body + "@@ -0,0 +1 @@\n+" + "y" * (size - len(body) - 16) + "\n")
    assert (folder / "0001-huge.patch").stat().st_size == size
    with pytest.raises(UserError, match=re.escape(f"4.2 MiB (4,400,000 bytes), over the {words} limit")):
        load_stack(folder)


@pytest.mark.parametrize("where", ["Subject", "Why", "diff"])
def test_a_nul_in_a_patch_is_refused_naming_the_file(cpu_package: Path, tmp_path: Path, patch_maker: PatchMaker,
                                                     pins, where: str) -> None:
    """Item 12: a NUL in a header was refused by git's own message, which does not name the patch file."""
    folder = tmp_path / "patches"
    patch = patch_maker.write(folder, "0001-nul.patch", patch_maker.edit("logger.py", "import ", "# x\nimport "))
    text = patch.read_text()
    text = text.replace("# x", "# x\0", 1) if where == "diff" else text.replace(f"{where}: ", f"{where}: a\0b ", 1)
    patch.write_text(text)
    result = _run(str(REPO_ROOT / "apply.py"), "apply", "--from", f"dir:{cpu_package}", "--patches", str(folder))
    assert result.returncode == 1, result.stderr
    line = one_line_error(result)
    number = text.count("\n", 0, text.index("\0")) + 1
    assert f"{patch}: line {number} holds a NUL byte" in line, line
    assert read_stamp(cpu_package) is None
