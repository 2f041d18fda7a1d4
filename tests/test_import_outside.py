"""`import` against the shapes real outside series take (issue 28, items 8 and 21-28): a revert inside a series of a
file the stack also changes, CRLF files, index ids of no release, special files as sources, every verdict in one
run, path filters and -p, and the mail and header details. Real git, real patch series, the real pinned package."""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import pytest

from rigstack import applier, cli
from rigstack.baseline import parse_source
from rigstack.commands import stack as apply_cli
from rigstack.stack import load_stack
from testing.forks import ERNIE, QWEN, Repo, blob, git
from testing.imports import header_of, run_cli, run_import, snapshot

GLM47 = "parser/glm47_moe.py"  # the stack of two_patches changes it
COPYRIGHT = "# SPDX-FileCopyrightText: Copyright contributors to the vLLM project\n"


def error_line(err: str) -> str:
    lines = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and "Traceback" not in err and "bug:" not in err, err
    return lines[0]


# -- item 21: a revert inside a series, of a file the stack also changes ------------------------------------------
def test_a_revert_in_a_series_of_a_file_the_stack_changes(pristine_cpu_tree: Path, two_patches: Path, pins,
                                                          tmp_path: Path) -> None:
    fork = Repo(tmp_path / "fork", pristine_cpu_tree, "vllm/", files=(GLM47,))
    fork.edit(GLM47, COPYRIGHT, COPYRIGHT + "# series: a note\n")
    fork.commit("glm47: a note")
    git(fork.root, "revert", "--no-edit", "HEAD")  # made on baseline + the series, not on the stack
    mbox = tmp_path / "series.mbox"
    mbox.write_text(git(fork.root, "format-patch", "--stdout", "HEAD~2..HEAD"))

    result = run_import(pins, two_patches, mbox)

    assert result.error is None, result.error
    assert [(p.file, p.status) for p in result.patches] == [("0003-glm47-a-note.patch", "applied"),
                                                           ('0004-revert-glm47-a-note.patch', "applied")]


# -- item 22: CRLF files are read as bytes ------------------------------------------------------------------------
def test_a_change_to_a_crlf_file(pristine_cpu_tree: Path, patches: Path, pins, cpu_package: Path,
                                 tmp_path: Path) -> None:
    # 0.32.0 wrote this module with CRLF endings, 0.34.0 with LF: the fork's line ends in CRLF either way.
    crlf = "config/fault_tolerance.py"
    fork = Repo(tmp_path / "fork", pristine_cpu_tree, "vllm/", files=(crlf,))
    target = fork.path(crlf)
    target.write_bytes(target.read_bytes() + b"# a fork's note\r\n")
    plain = tmp_path / "note.diff"
    plain.write_bytes(subprocess.run(["git", "diff"], cwd=fork.root, capture_output=True, check=True).stdout)
    fork.commit("fault tolerance: a note")
    mail = tmp_path / "mail.patch"
    mail.write_bytes(subprocess.run(["git", "format-patch", "--stdout", "-1"], cwd=fork.root, capture_output=True,
                                    check=True).stdout)
    for source in (mail, plain):
        folder = tmp_path / f"stack-{source.stem}"
        folder.mkdir()
        result = run_import(pins, folder, source)
        assert result.error is None and result.patches[0].status == "applied", result.error
        written = folder / result.patches[0].file
        assert b"+# a fork's note\r\n" in written.read_bytes()
        assert f"index {blob(pristine_cpu_tree / crlf)}..{blob(target)} 100644" in written.read_text()
    package = cpu_package
    applied = applier.apply_stack(parse_source(f"dir:{package}"), load_stack(tmp_path / "stack-mail"), pins)
    assert applied.error is None
    assert (package / crlf).read_bytes() == target.read_bytes()  # every CR kept


# -- item 23: --ignore-index trusts the context, says so, and names the offsets ----------------------------------
def _made_elsewhere(fork: Repo, tmp_path: Path) -> Path:
    """A patch made on a build whose qwen3.py has three more lines at the top: ids of no release, hunks 3 off."""
    other = fork.path(QWEN).read_text()
    fork.path(QWEN).write_text("# a\n# b\n# c\n" + other)
    fork.commit("another build")
    fork.edit(QWEN, "import json\n", "import json\n# made elsewhere\n")
    fork.commit("qwen: a note made elsewhere")
    path = tmp_path / "elsewhere.patch"
    path.write_text(git(fork.root, "format-patch", "--stdout", "-1"))
    return path


def test_ignore_index_trusts_the_context_and_says_so(fork: Repo, patches: Path, pristine_cpu_tree: Path, pins,
                                                     tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    from rigstack.importer import ImportOptions  # here, not at the top: main's importer has none (the check)

    source = _made_elsewhere(fork, tmp_path)
    code, err = run_cli(capsys, "import", str(source), "--patches", str(patches), "--base", "wheel:cpu")
    assert code == 1 and "made on another vLLM build" in error_line(err) and "--ignore-index" in error_line(err)
    assert snapshot(patches) == {}
    dry = run_import(pins, patches, source, dry_run=True, options=ImportOptions(ignore_index=True))
    assert (dry.patches[0].status, dry.patches[0].detail) == (
        "offset", "hunks moved: vllm/parser/qwen3.py: hunk 1 by -3 lines; made exact on import")
    code, err = run_cli(capsys, "import", str(source), "--patches", str(patches), "--base", "wheel:cpu",
                        "--ignore-index")
    assert code == 0, err
    written = patches / "0001-qwen-a-note-made-elsewhere.patch"
    origin = next(line for line in header_of(written) if line.startswith("Origin: "))
    assert origin.endswith("; imported with --ignore-index: its index lines match no blob of the baseline or the "
                           "series, so its context was trusted; hunks moved: vllm/parser/qwen3.py: hunk 1 by -3 lines")
    assert f"index {blob(pristine_cpu_tree / QWEN)}.." in written.read_text()  # the ids made right by git


# -- item 24: an old release's wheel is found as pip finds it ----------------------------------------------------
def test_an_old_release_as_the_base(patches: Path, tmp_path: Path, capfd: pytest.CaptureFixture) -> None:
    """vllm 0.2.0 has only cp311 manylinux1 wheels (as every release before 0.22.0 has manylinux1 ones): the lookup
    must take what pip would install here, not one forced platform tag."""
    import sys

    import zipfile

    from rigstack.wheelindex import release_wheel

    if sys.version_info[:2] != (3, 11):
        pytest.skip("vllm 0.2.0's wheels are for CPython 3.11 only")
    wheel = release_wheel("vllm", "0.2.0")
    assert wheel is not None and "manylinux1" in wheel.name
    old = tmp_path / "old"
    with zipfile.ZipFile(wheel) as archive:
        text = archive.read("vllm/__init__.py").decode()
    (old / "a" / "vllm").mkdir(parents=True)
    (old / "b" / "vllm").mkdir(parents=True)
    (old / "a" / "vllm" / "__init__.py").write_text(text)
    (old / "b" / "vllm" / "__init__.py").write_text(text.replace('__version__ = "0.2.0"',
                                                                 '__version__ = "0.2.0"  # a rig note'))
    diff = subprocess.run(["git", "diff", "--no-index", "a/vllm/__init__.py", "b/vllm/__init__.py"], cwd=old,
                          capture_output=True, text=True).stdout
    source = tmp_path / "note.diff"
    source.write_text("Subject: a note on the old release\n\n" + diff.replace("a/a/", "a/").replace("b/b/", "b/"))
    # capfd: pip's progress bar goes to the real stderr descriptor
    code, err = run_cli(capfd, "import", str(source), "--patches", str(patches), "--base", "wheel:0.2.0")
    assert code == 0, err
    assert "is not the pinned vLLM baseline" in " ".join(err.split())
    assert (patches / "0001-a-note-on-the-old-release.patch").is_file()


# -- item 26: every patch's verdict in one run; --json on a refusal ----------------------------------------------
def test_every_patch_gets_its_verdict(fork: Repo, patches: Path, tmp_path: Path,
                                      capsys: pytest.CaptureFixture) -> None:
    fork.edit(QWEN, "import json\n", "import json\n# one\n")
    fork.commit("one: made on another build")
    fork.edit(ERNIE, "import json\n", "import json\n# two\n")
    fork.commit("two: fine")
    fork.edit(ERNIE, "import json\n# two\n", "import json\n# two and three\n")
    fork.commit("three: fine after two")
    text = git(fork.root, "format-patch", "--stdout", "HEAD~3..HEAD")
    old = text.split("\nindex ")[1].split("..")[0]
    mbox = tmp_path / "mixed.mbox"
    mbox.write_text(text.replace(f"index {old}..", "index 1234567..", 1))
    mbox_conflict = tmp_path / "conflict.patch"
    fresh = Repo(tmp_path / "fresh", fork.pristine, "vllm/")
    fresh.edit(QWEN, "import json\n", "import json\n# four\n")
    fresh.commit("four: will not apply")
    mail = git(fresh.root, "format-patch", "--stdout", "-1")
    mbox_conflict.write_text(mail.replace("\n import json\n", "\n import json5\n"))  # a stale context

    code = cli.run(apply_cli.app, ["import", str(mbox), str(mbox_conflict), "--patches", str(patches),
                                   "--base", "wheel:cpu", "--json"])
    out, err = capsys.readouterr()
    assert code == 1
    assert error_line(err).startswith("error: 2 of the 4 patches do not import (each one's verdict is in the table); "
                                      "the first: mixed.mbox message 1 (one: made on another build): vllm/parser/"
                                      "qwen3.py has index 1234567")
    report = json.loads(out)
    assert [(row["id"], row["status"]) for row in report["patches"]] == [
        ("0001", "refused"), ("0002", "applied"), ("0003", "applied"), ("0004", "conflict")]
    assert report["patches"][0]["detail"].startswith("vllm/parser/qwen3.py has index 1234567")
    assert report["written"] == [] and snapshot(patches) == {}


def test_json_is_printed_on_a_refusal_too(patches: Path, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    code = cli.run(apply_cli.app, ["import", str(tmp_path / "nothing.patch"), "--patches", str(patches),
                                   "--base", "wheel:cpu", "--json"])
    out, err = capsys.readouterr()
    assert code == 1 and "no such file or folder" in error_line(err)
    report = json.loads(out)
    assert report["error"] == error_line(err).removeprefix("error: ") and report["patches"] == []


# -- item 8 (import sources): a regular file, read with a bound ---------------------------------------------------
@pytest.mark.timeout(60)  # in-process: a FIFO read without a writer would hang the worker
@pytest.mark.parametrize("kind, expected", [("fifo", "a FIFO (named pipe), not a regular file"),
                                            ("zero", "a character device, not a regular file"),
                                            ("dangling", "which does not exist"), ("loop", "a symlink loop")])
def test_special_files_as_sources(patches: Path, tmp_path: Path, capsys: pytest.CaptureFixture, kind: str,
                                  expected: str) -> None:
    path = tmp_path / "odd.patch"
    {"fifo": lambda: os.mkfifo(path), "zero": lambda: path.symlink_to("/dev/zero"),
     "dangling": lambda: path.symlink_to(tmp_path / "gone"), "loop": lambda: path.symlink_to(path)}[kind]()
    began = time.monotonic()
    code, err = run_cli(capsys, "import", str(path), "--patches", str(patches), "--base", "wheel:cpu")
    assert code == 1 and time.monotonic() - began < 60
    line = error_line(err)
    assert line.startswith(f"error: import source {path}: ") and expected in line, line
    assert snapshot(patches) == {}
    series = tmp_path / "quilt"
    series.mkdir()
    (series / "series").symlink_to("/dev/zero")
    code, err = run_cli(capsys, "import", str(series), "--patches", str(patches), "--base", "wheel:cpu")
    assert code == 1 and f"quilt series {series / 'series'}: a character device" in error_line(err)


# -- item 27: --include / --exclude, -p for plain diffs, and a series' absolute path ------------------------------
def test_path_filters_keep_the_package_part(fork: Repo, patches: Path, tmp_path: Path,
                                            capsys: pytest.CaptureFixture) -> None:
    fork.edit(QWEN, "import json\n", "import json\n# with a test\n")
    (fork.root / "tests" / "test_x.py").write_text("X = 2\n")
    (fork.root / "requirements.txt").write_text("regex\n")
    fork.commit("qwen note, its test and a requirement")
    mail = tmp_path / "mixed.patch"
    mail.write_text(git(fork.root, "format-patch", "--stdout", "-1"))
    code, err = run_cli(capsys, "import", str(mail), "--patches", str(patches), "--base", "wheel:cpu")
    assert code == 1 and "outside the vllm/ package" in error_line(err)
    for options, name in ((["--include", "vllm/*"], "a"), (["--exclude", "tests/*", "--exclude", "requirements*"],
                                                            "b")):
        folder = tmp_path / name
        folder.mkdir()
        code, err = run_cli(capsys, "import", str(mail), "--patches", str(folder), "--base", "wheel:cpu", *options)
        assert code == 0, err
        written = folder / "0001-qwen-note-its-test-and-a.patch"
        text = written.read_text()
        assert "diff --git a/vllm/parser/qwen3.py" in text and "test_x" not in text.partition("\n---\n")[2]
        origin = next(line for line in header_of(written) if line.startswith("Origin: "))
        assert "import left out requirements.txt, tests/test_x.py (--include/--exclude)" in origin
    code, err = run_cli(capsys, "import", str(mail), "--patches", str(patches), "--base", "wheel:cpu",
                        "--include", "csrc/*")
    assert code == 1 and "--include/--exclude leave none of its files" in error_line(err)


def test_strip_for_a_plain_diff(pristine_cpu_tree: Path, patches: Path, tmp_path: Path,
                                capsys: pytest.CaptureFixture) -> None:
    package = Repo(tmp_path / "pkg", pristine_cpu_tree, "")
    package.edit(QWEN, "import json\n", "import json\n# deep\n")
    deep = git(package.root, "diff", "--src-prefix=x/old/", "--dst-prefix=x/new/")
    source = tmp_path / "deep.diff"
    source.write_text("A deep note.\n\n" + deep)
    code, err = run_cli(capsys, "import", str(source), "--patches", str(patches), "--base", "wheel:cpu")
    assert code == 1
    code, err = run_cli(capsys, "import", str(source), "--patches", str(patches), "--base", "wheel:cpu", "-p", "2")
    assert code == 0, err
    assert "diff --git a/vllm/parser/qwen3.py" in (patches / "0001-a-deep-note.patch").read_text()


@pytest.mark.parametrize("name", ["/etc/hostname", "../outside.patch", "link.patch"])
def test_a_series_names_only_its_own_folder(patches: Path, tmp_path: Path, capsys: pytest.CaptureFixture,
                                            name: str) -> None:
    quilt = tmp_path / "quilt"
    quilt.mkdir()
    (tmp_path / "outside.patch").write_text("not in the folder\n")
    (quilt / "link.patch").symlink_to(tmp_path / "outside.patch")
    (quilt / "series").write_text(f"{name} -p1\n")
    code, err = run_cli(capsys, "import", str(quilt), "--patches", str(patches), "--base", "wheel:cpu")
    assert code == 1
    assert error_line(err) == (f"error: {quilt / 'series'} line 1 names {name}, which is outside {quilt}; a series "
                               "names the patches in its own folder")


# -- item 28: mails and headers ----------------------------------------------------------------------------------
def test_a_nul_in_a_subject_is_refused(fork: Repo, patches: Path, tmp_path: Path,
                                       capsys: pytest.CaptureFixture) -> None:
    fork.edit(QWEN, "import json\n", "import json\n# nul\n")
    fork.commit("fix the thing really")
    mail = tmp_path / "nul.patch"
    mail.write_bytes(git(fork.root, "format-patch", "--stdout", "-1").replace("fix the thing",
                                                                              "fix the\0 thing").encode())
    code, err = run_cli(capsys, "import", str(mail), "--patches", str(patches), "--base", "wheel:cpu")
    assert code == 1 and error_line(err) == ("error: nul.patch: a NUL byte in its mail headers (the Subject would be "
                                             "cut there); remove it")


def test_a_mail_without_its_from_line(fork: Repo, patches: Path, pins, tmp_path: Path) -> None:
    fork.edit(QWEN, "import json\n", "import json\n# no from line\n")
    fork.commit("qwen: a note from a pasted mail")
    mail = git(fork.root, "format-patch", "--stdout", "-1")
    pasted = tmp_path / "pasted.patch"
    pasted.write_text(mail.partition("\n")[2])  # the "From <sha> <date>" line cut off, as a paste does
    result = run_import(pins, patches, pasted)
    assert result.error is None and result.patches[0].subject == "qwen: a note from a pasted mail"


def test_slugs_differ_and_origin_names_the_repository(pristine_cpu_tree: Path, patches: Path, pins,
                                                      tmp_path: Path) -> None:
    fork = Repo(tmp_path / "fork", pristine_cpu_tree, "vllm/")
    git(fork.root, "remote", "add", "origin", "https://oauth2:SECRET@git.example/rig/vllm.git")
    long = "platforms: keep the device check of vllm/platforms in "
    fork.edit(QWEN, "import json\n", "import json\n# one\n")
    fork.commit(long + "cuda.py")
    fork.edit(ERNIE, "import json\n", "import json\n# two\n")
    fork.commit(long + "cuda_communicator.py")
    result = run_import(pins, patches, f"git:{fork.root}@HEAD~2..HEAD")
    assert result.error is None
    assert [p.file for p in result.patches] == [
        "0001-platforms-keep-the-device-check-of-vllm-platforms-in-cuda-py.patch",
        "0002-platforms-keep-the-device-check-of-vllm-platforms-in-cuda-communicator-py.patch"]
    origin = next(line for line in header_of(patches / result.patches[0].file) if line.startswith("Origin: "))
    assert origin.endswith("; repository https://git.example/rig/vllm.git") and "SECRET" not in origin
    # A patch file committed in a checkout: Origin says which file of which repository at which commit.
    shelf = tmp_path / "shelf"
    (shelf / "patches").mkdir(parents=True)
    git(shelf, "init", "-q")
    git(shelf, "remote", "add", "origin", "https://git.example/rig/patches.git")
    mail = shelf / "patches" / "qwen.patch"
    mail.write_text(git(fork.root, "format-patch", "--stdout", "-1", "HEAD~1"))
    git(shelf, "add", "-A")
    git(shelf, "commit", "-qm", "the rig's patches")
    sha = git(shelf, "rev-parse", "HEAD").strip()
    other = tmp_path / "other-stack"
    other.mkdir()
    result = run_import(pins, other, mail)
    assert result.error is None
    origin = next(line for line in header_of(other / result.patches[0].file) if line.startswith("Origin: "))
    assert origin.endswith(f"; patches/qwen.patch in https://git.example/rig/patches.git at commit {sha}")
