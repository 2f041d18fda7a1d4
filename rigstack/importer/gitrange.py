"""A range of commits in a git repository (a fork of vLLM, or a repository of the package): one patch per commit."""

from __future__ import annotations

import tempfile
from pathlib import Path

from rigstack.errors import UserError
from dataclasses import replace

from rigstack.gitrepo import PackageRepo, checkout_revision
from rigstack.importer.incoming import Incoming
from rigstack.importer.mbox import read_mbox
from rigstack.stack import PACKAGE

PREFIX = "git:"


def read_range(spec: str, git: PackageRepo, work: Path) -> list[Incoming]:
    """git:PATH@A..B, oldest commit first, made into mails by `git format-patch` (renames kept) and read as such."""
    path_text, _, revisions = spec[len(PREFIX):].rpartition("@")
    if not path_text or ".." not in revisions:
        raise UserError(f"{spec!r} is not a git range; write git:PATH@A..B (e.g. git:../my-fork@v0.32.0..HEAD)")
    path = Path(path_text).expanduser().absolute()
    git_dir = path / ".git" if (path / ".git").exists() else path
    if not (git_dir / "HEAD").exists() and not (path / ".git").is_file():
        raise UserError(f"{path} is not a git repository; point git:PATH at one")
    repo = PackageRepo(path, git_dir=git_dir)
    merges = repo.run("rev-list", "--merges", revisions).split()
    if merges:
        raise UserError(f"{spec}: commit {merges[0][:12]} is a merge; a patch stack is linear: import the ranges on "
                        "either side of it, or rebase the branch first")
    commits = repo.run("rev-list", "--reverse", revisions).split()
    if not commits:
        raise UserError(f"{spec} names no commits; check the range with `git log {revisions}`")
    layout = _layout(repo, commits[-1], path)
    mbox = Path(tempfile.mkstemp(prefix="range-", suffix=".mbox", dir=work)[1])
    # Explicit prefixes and no signature: the repository's own diff and format settings must not change the mails.
    mbox.write_bytes(repo.run("format-patch", "--stdout", "-M", "--no-signature", "--no-color", "--src-prefix=a/",
                              "--dst-prefix=b/", "--no-binary", revisions).encode())
    items = read_mbox(mbox, git, work, f"{PREFIX}{path}", layout=layout, by_commit=True)
    source = checkout_revision(path)[0]  # the origin remote without credentials; file://PATH is the label already
    items = [item if source.startswith("file://") else replace(item, where=f"repository {source}") for item in items]
    if len(items) != len(commits):
        raise UserError(f"{spec}: {len(commits)} commits but {len(items)} patches; a commit that changes nothing "
                        "has no patch: drop it from the range")
    return items


def _layout(repo: PackageRepo, commit: str, path: Path) -> str:
    """Where the package sits: a fork of vLLM has vllm/ at its top, a repository of the package is the package."""
    top = set(repo.run("ls-tree", "--name-only", commit).split())
    if PACKAGE in top:
        return "fork"
    if "__init__.py" in top:
        return "package"
    raise UserError(f"{path} has neither {PACKAGE}/ at its top nor the {PACKAGE} package itself; import from a fork of "
                    "vLLM or a repository of the package")
