"""Reading a file a user names (a patch, a profile, an import source): a regular file, read with a bound.

A directory, a FIFO, a device such as /dev/zero, a socket, a dangling symlink or a symlink loop is one clear error
instead of a hang, an unbounded read or a traceback. The bound holds while reading, not only by stat: a file that
grows, or a /proc file that reports size 0, still stops at `limit`.
"""

from __future__ import annotations

import errno
import hashlib
import os
import stat
from pathlib import Path

from rigstack.errors import UserError

KIB = 1 << 10
MIB = 1 << 20
_KINDS = ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISCHR, "a character device"),
          (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"))


def size_text(count: int) -> str:
    """The one spelling of a size in messages and docs: "4 MiB (4,194,304 bytes)", "4.2 MiB (4,400,000 bytes)"."""
    for unit, scale in (("GiB", 1 << 30), ("MiB", MIB), ("KiB", KIB)):
        if count >= scale:
            value = f"{count // scale}" if count % scale == 0 else f"{count / scale:.1f}"
            return f"{value} {unit} ({count:,} bytes)"
    return f"{count:,} bytes"


def _open(path: Path, what: str, fix: str) -> int:
    try:
        # O_NONBLOCK: opening a FIFO without a writer would otherwise wait forever, before fstat can say what it is.
        return os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    except OSError as error:
        if error.errno == errno.ENOENT and os.path.lexists(path):
            reason = f"a symlink to {os.readlink(path)}, which does not exist"
        elif error.errno == errno.ENOENT:
            reason = "does not exist"
        elif error.errno == errno.ELOOP:
            reason = "a symlink loop"
        elif error.errno == errno.ENXIO:
            reason = "a socket"
        else:
            reason = f"cannot be read ({error.strerror})"
        raise UserError(f"{what} {path}: {reason}; {fix}") from None


def read_regular(path: Path, what: str, limit: int, fix: str) -> bytes:
    """The bytes of `path`, which must be a regular file of at most `limit` bytes. `what` names the file in the
    error ("profile", "patch", "import source") and `fix` says what to do instead."""
    fd = _open(path, what, fix)
    status = os.fstat(fd)
    if not stat.S_ISREG(status.st_mode):
        os.close(fd)
        kind = next((name for test, name in _KINDS if test(status.st_mode)), "not a file")
        raise UserError(f"{what} {path}: {kind}, not a regular file; {fix}")
    with os.fdopen(fd, "rb") as file:
        try:
            data = file.read(limit + 1)
        except OSError as error:
            raise UserError(f"{what} {path}: cannot be read ({error.strerror}); {fix}") from None
    if len(data) > limit:
        size = max(status.st_size, len(data))
        over = f"{size_text(size)}, over" if size > limit else "over"
        raise UserError(f"{what} {path}: {over} the {size_text(limit)} limit; {fix}")
    return data


def read_utf8(path: Path, what: str, limit: int, fix: str) -> str:
    """read_regular decoded as UTF-8, every byte kept (a CRLF file's CRs are content); a wrong byte is named by line
    and column, never replaced."""
    data = read_regular(path, what, limit, fix)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as error:
        line = data.count(b"\n", 0, error.start) + 1
        column = error.start - (data.rfind(b"\n", 0, error.start) + 1) + 1
        raise UserError(f"{what} {path}:{line}: not UTF-8 text (byte 0x{data[error.start]:02x} at column {column}); "
                        "save the file as UTF-8") from None


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        while chunk := handle.read(1 << 22):
            digest.update(chunk)
    return digest.hexdigest()
