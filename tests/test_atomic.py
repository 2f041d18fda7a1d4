"""One atomic-write helper, one `_version.py` parser, and git failures the user can act on as UserErrors."""

from __future__ import annotations

from pathlib import Path

import pytest

from rigstack import history
from rigstack.atomic import replacing, write_atomic
from rigstack.errors import UserError
from rigstack.gitrepo import PackageRepo
from rigstack.probes.results import write_result
from rigstack.versions import package_version, release_of
from testing.probes import make_result


def test_a_failed_write_keeps_the_old_file_and_leaves_no_temporary(tmp_path: Path) -> None:
    target = write_atomic(tmp_path / "record.json", "old\n")
    with pytest.raises(RuntimeError), replacing(target) as tmp:
        tmp.write_text("half")
        raise RuntimeError("killed mid-write")
    assert target.read_text() == "old\n"
    assert [path.name for path in tmp_path.iterdir()] == ["record.json"]
    write_atomic(target, b"new\n")
    assert target.read_text() == "new\n"
    assert [path.name for path in tmp_path.iterdir()] == ["record.json"]


def test_a_failing_plot_leaves_no_partial_png(tmp_path: Path) -> None:
    def plot(_result, path: Path) -> None:
        assert path.suffix == ".png"  # matplotlib picks the format from it
        path.write_bytes(b"\x89PNG partial")
        raise ValueError("plot failed half way")

    with pytest.raises(ValueError):
        write_result(make_result(), tmp_path / "bench", plot=plot)
    assert sorted(path.name for path in tmp_path.iterdir()) == ["bench.json"]


@pytest.mark.parametrize(("text", "version"), [
    ("__version__ = version = '0.32.0+cpu'\n__version_tuple__ = (0, 32, 0)\n", "0.32.0+cpu"),
    ('__version__ = "0.33.0"\n', "0.33.0"),
    ("# no version here\n", None),
])
def test_one_version_parser_for_both_flavours(text: str, version: str | None) -> None:
    assert package_version(text) == version
    if version:
        assert release_of(version) == version.split("+")[0]


def _committed_package(tmp_path: Path) -> PackageRepo:
    package = tmp_path / "vllm"
    package.mkdir()
    (package / "__init__.py").write_text("")
    repo = PackageRepo(package)
    repo.init()
    repo.run("add", "-A")
    repo.run("commit", "-q", "-m", "baseline")
    return repo


def test_a_package_without_version_file_reads_unknown_not_a_crash(tmp_path: Path) -> None:
    repo = _committed_package(tmp_path)
    assert history.version_of(repo, repo.rev("HEAD")) == "unknown"


def test_git_failures_are_user_errors_with_gits_message_and_queries_say_none(tmp_path: Path) -> None:
    repo = _committed_package(tmp_path)
    assert repo.query("cat-file", "blob", "HEAD:missing.py") is None
    assert repo.blob_text("HEAD", "missing.py") is None and repo.rev("no-such-ref") is None
    with pytest.raises(UserError, match=r"^git cat-file failed in .*vllm: fatal: path 'missing.py' does not exist"):
        repo.run("cat-file", "blob", "HEAD:missing.py")
