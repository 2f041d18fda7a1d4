"""Small git repositories standing in for a user's vLLM fork or package repository, with fixed authors and dates."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

QWEN = "parser/qwen3.py"
ERNIE = "tool_parsers/ernie45_tool_parser.py"  # 8.4 KB: a rename that must stay small
_DATE = "2026-01-02T03:04:05+00:00"


def git(cwd: Path, *args: str, author: str = "Jane Doe") -> str:
    env = {**os.environ, "GIT_AUTHOR_NAME": author, "GIT_AUTHOR_EMAIL": "jane@example.com", "GIT_AUTHOR_DATE": _DATE,
           "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@t", "GIT_COMMITTER_DATE": _DATE,
           "GIT_CONFIG_GLOBAL": os.devnull}
    return subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True, text=True, env=env).stdout


def blob(path: Path) -> str:
    return subprocess.run(["git", "hash-object", str(path)], check=True, capture_output=True, text=True).stdout.strip()


class Repo:
    """A small git repository holding pristine files at `prefix` (vllm/ for a fork of vLLM, '' for the package)."""

    def __init__(self, root: Path, pristine: Path, prefix: str, files: tuple[str, ...] = (QWEN, ERNIE)) -> None:
        self.root, self.pristine, self.prefix = root, pristine, prefix
        for name in files:
            target = root / prefix / name
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(pristine / name, target)
        if not prefix:
            (root / "__init__.py").write_text((pristine / "__init__.py").read_text())
        git(root, "init", "-q")
        git(root, "add", "-A")
        git(root, "commit", "-qm", "pristine vllm 0.32.0")

    def path(self, name: str) -> Path:
        return self.root / self.prefix / name

    def edit(self, name: str, old: str, new: str) -> None:
        text = self.path(name).read_text()
        assert old in text
        self.path(name).write_text(text.replace(old, new, 1))

    def commit(self, message: str, author: str = "Jane Doe") -> str:
        git(self.root, "add", "-A")
        git(self.root, "commit", "-qm", message, author=author)
        return git(self.root, "rev-parse", "HEAD").strip()
