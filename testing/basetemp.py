"""The suite's base folder for tmp_path: short, claimed while a run uses it, and earlier runs' folders pruned.

A run of `make test` writes 10-13 GB under its base (a copy of vLLM per patching test, servers' compile caches); a
run that fails or is killed keeps its folder, and three such folders filled a CI box's disk mid-run (every later
test errored with ENOSPC). pyproject's tmp_path_retention_policy = "failed" drops each passing test's tmp_path as it
goes; this module drops what earlier runs left, except the newest (the failed run whose logs one may be reading).
A run holds an flock on a lock file beside its folder (rs-XXXX.in-use) for its whole life, so a folder whose lock
can be taken is no run's. Beside, not inside: pytest empties a given base folder by deleting and remaking it, which
would take a lock file inside with it."""

from __future__ import annotations

import fcntl
import os
import shutil
import tempfile
from pathlib import Path
from typing import IO

PREFIX = "rs-"
LOCK_SUFFIX = ".in-use"


def _lock_path(folder: Path) -> Path:
    return folder.with_name(folder.name + LOCK_SUFFIX)


def claim(parent: Path) -> tuple[Path, IO[str]]:
    """A new base folder under parent, and the open lock file that marks it in use until this process ends."""
    base = Path(tempfile.mkdtemp(prefix=PREFIX, dir=parent))
    lock = open(_lock_path(base), "w")  # held open, so locked, for the rest of this process
    fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    return base, lock


def release(base: Path, lock: IO[str]) -> None:
    """A passing run's end: its folder and its lock file go."""
    shutil.rmtree(base, ignore_errors=True)
    lock.close()
    _lock_path(base).unlink(missing_ok=True)


def _unused(folder: Path) -> bool:
    """A run claimed folder and no live run holds its lock. A folder with no lock file is not a run's base (the
    multinode test's /tmp/rs-<namespace> folders, live while it runs) and is never taken for an abandoned one."""
    try:
        descriptor = os.open(_lock_path(folder), os.O_RDONLY)
    except OSError:
        return False
    try:
        fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except BlockingIOError:
        return False
    finally:
        os.close(descriptor)


def prune(parent: Path, keep: Path) -> list[Path]:
    """Remove earlier runs' folders under parent that no run holds, all but the newest of them, with their lock
    files; keep is this run's. Returns what was removed."""
    earlier = sorted((folder for folder in parent.glob(f"{PREFIX}*")
                      if folder.is_dir() and folder != keep and _unused(folder)),
                     key=lambda folder: folder.stat().st_mtime)
    removed = earlier[:-1]
    for folder in removed:
        shutil.rmtree(folder, ignore_errors=True)
        _lock_path(folder).unlink(missing_ok=True)
    return removed
