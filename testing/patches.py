"""Real patches for tests, made with real git from a scratch copy of the pristine package."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

_GIT_IDENTITY = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
                 "GIT_COMMITTER_EMAIL": "t@t"}


class PatchMaker:
    """Writes real patches with real git: edit a scratch copy of the pristine tree, diff, restore."""

    def __init__(self, tree: Path) -> None:
        self.tree = tree
        for args in (["init", "-q"], ["add", "-A"], ["commit", "-qm", "pristine"]):
            self._git(*args)
        self.pristine = self._git("rev-parse", "HEAD").strip()

    def _git(self, *args: str) -> str:
        return subprocess.run(["git", *args], cwd=self.tree, check=True, capture_output=True, text=True,
                              env={**os.environ, **_GIT_IDENTITY}).stdout

    def _edit(self, edits: dict[str, str | None]) -> None:
        for path, text in edits.items():
            target = self.tree / path
            if text is None:
                target.unlink()
            else:
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_text(text)
        self._git("add", "-A")

    def diff(self, edits: dict[str, str | None], on_top_of: dict[str, str | None] | None = None) -> str:
        """edits: package-relative path -> new text (None deletes), made on the pristine tree or on top of other
        edits. Returns the diff in the stack's dialect."""
        from rigstack.gitrepo import DIFF_OPTIONS

        try:
            if on_top_of:
                self._edit(on_top_of)
                self._git("commit", "-qm", "base")
            self._edit(edits)
            return self._git("diff", "--cached", *DIFF_OPTIONS)
        finally:
            self._git("reset", "-q", "--hard", self.pristine)
            self._git("clean", "-qfd")

    def read(self, path: str) -> str:
        return (self.tree / path).read_text()

    def edit(self, path: str, old: str, new: str) -> dict[str, str]:
        """One replacement in one pristine file, as an edits mapping."""
        text = self.read(path)
        assert old in text, f"{old!r} not in {path}"
        return {path: text.replace(old, new, 1)}

    def write(self, folder: Path, name: str, edits: dict[str, str | None], subject: str = "a test change",
              extra_header: str = "", on_top_of: dict[str, str | None] | None = None) -> Path:
        folder.mkdir(parents=True, exist_ok=True)
        header = (f"Subject: {subject}\nWhy: tests need a real patch\nOrigin: rigstack tests\nUpstream: not submitted\n"
                  f"Switch: none (bug fix)\nRigs: all\nTests: tests/test_applier.py\n{extra_header}")
        path = folder / name
        path.write_text(header + "---\n" + self.diff(edits, on_top_of))
        return path
