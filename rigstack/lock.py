"""One apply (or port) at a time per target: flocks the kernel drops when their process dies."""

from __future__ import annotations

import fcntl
import os
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

from rigstack.errors import UserError

LOCK = "lock"
PROC_LOCKS = Path("/proc/locks")


@contextmanager
def target_lock(state: Path, target: Path, what: str = "apply") -> Iterator[None]:
    """An flock on a file in the target's state folder holding the owner's pid, and one on the target folder itself.

    The kernel drops an flock when its process dies, so a killed run never blocks the next one. The second lock is on
    the folder's inode: two paths to one package (a symlink, a bind mount) are one target whatever their state
    folders. Folders made only to hold the lock are removed again when nothing else was put in them."""
    missing = [folder for folder in (state, *state.parents) if not folder.exists()]
    state.mkdir(parents=True, exist_ok=True)
    path = state / LOCK
    with ExitStack() as held:
        fd = _lock_file(path, target, what)
        held.callback(_release, fd, path, state, missing)
        if target.is_dir():
            folder = os.open(target, os.O_RDONLY | os.O_DIRECTORY)
            held.callback(os.close, folder)
            _take(folder, target, what, lambda: _holder_from_proc(folder))
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        yield


def _lock_file(path: Path, target: Path, what: str) -> int:
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            _take(fd, target, what, lambda: os.pread(fd, 20, 0).decode(errors="replace").strip())
        except UserError:
            os.close(fd)
            raise
        try:
            same = os.stat(path).st_ino == os.fstat(fd).st_ino
        except FileNotFoundError:
            same = False
        if same:
            return fd
        os.close(fd)  # the holder removed the file after we opened it: take the lock on the new one


def _take(fd: int, target: Path, what: str, holder) -> None:  # noqa: ANN001 - a callable naming the holder's pid
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        raise UserError(f"another {what} (pid {holder() or 'unknown'}) is working on {target}; wait for it to "
                        "finish, then rerun") from None


def _holder_from_proc(fd: int) -> str:
    """The pid holding an flock on fd's inode, from the kernel's own table (the holder's state folder, where its pid
    file is, may be another one)."""
    info = os.fstat(fd)
    inode = f"{os.major(info.st_dev):02x}:{os.minor(info.st_dev):02x}:{info.st_ino}"
    try:
        table = PROC_LOCKS.read_text()
    except OSError:
        return ""
    # "1: FLOCK  ADVISORY  WRITE 1234 fd:01:5678 0 EOF"; a waiter's line starts with "->" and is not the holder.
    return next((fields[4] for fields in (line.split() for line in table.splitlines())
                 if len(fields) > 5 and fields[1] == "FLOCK" and fields[5] == inode), "")


def _release(fd: int, path: Path, state: Path, missing: list[Path]) -> None:
    try:
        if [entry.name for entry in state.iterdir()] == [LOCK]:
            path.unlink()
            for folder in missing:
                try:
                    folder.rmdir()
                except OSError:  # someone else's files arrived meanwhile
                    break
    finally:
        os.close(fd)
