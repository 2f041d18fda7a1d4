"""Writes that a reader (or a crash) never sees half done: a temporary file beside the target, then os.replace."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from rigstack.errors import UserError


def _temp_name(path: Path, writer: str) -> str:
    return f".{path.stem}.{writer}.tmp{path.suffix}"


def temp_beside(path: Path) -> Path:
    """A name in the same folder (so os.replace stays on one file system and is atomic), hidden, unique per process
    (two writers of one cache file never share it), keeping the suffix (matplotlib picks the format from it)."""
    return path.with_name(_temp_name(path, str(os.getpid())))


def temp_glob(path: Path) -> str:
    """The glob matching every writer's temporary name for `path`: what git must not see as a user's file."""
    return _temp_name(path, "*")


@contextmanager
def replacing(path: Path) -> Iterator[Path]:
    """Yield a temporary path to write; it replaces `path` when the block ends normally and is removed otherwise."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = temp_beside(path)
    try:
        yield tmp
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def write_atomic(path: Path, data: str | bytes, private: bool = False) -> Path:
    """Write all of `data` to `path` or, on any failure, leave `path` as it was; `private`: readable by its owner
    alone (0600), from the first byte, for files that may hold a secret."""
    with replacing(path) as tmp:
        if private:
            os.close(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600))
        tmp.write_bytes(data.encode() if isinstance(data, str) else data)
    return path


def check_writable(path: Path, what: str, fix: str) -> Path:
    """Refuse, before any long work, a file `path` that could not be written when that work ends: its folder is
    made if missing and a temporary file is created and removed there (a read-only mount or a missing permission
    fails here as it would at the end; a disk that fills during the work is still met there). A one-line UserError
    naming `what` and `fix`."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        handle, name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".probe", dir=path.parent)
        os.close(handle)
        os.unlink(name)
    except OSError as error:
        raise UserError(f"cannot write {what} {path} ({error.strerror}); {fix}; nothing was run") from None
    return path
