"""The packages the patch proof judges each patch against: the pristine package with the patches below it applied.

A test named by patch N must fail where N's code is missing and everything N builds on is there: against the
pristine package, a test of N could be satisfied by an earlier patch's code (issue 37). The first patch is judged
against the pristine package itself; every other against a copy of it (compiled files included, so it imports like
the pristine one) that the applier brought to the stack below (`apply.py apply --from dir:... --until`).

Each is kept under the rigstack cache, keyed by the pristine package's content and the stack below, so the next proof
reuses it. A baseline is built in a temporary folder and renamed into place only when complete: a killed build leaves
a temporary, never an entry, and an entry's name changes with anything that would change its files.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
import time
from fnmatch import fnmatch
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path

from rigstack.applier import apply_stack
from rigstack.atomic import temp_glob
from rigstack.baseline import DirSource
from rigstack.cache import cache_dir
from rigstack.errors import UserError
from rigstack.files import sha256_of
from rigstack.gitrepo import state_dir_for
from rigstack.stack import Stack
from rigstack.stamp import STAMP_NAME
from rigstack.versions import Pins

PRISTINE = "pristine"
FOLDER = "proof-baselines"  # under the rigstack cache
_FORMAT = "1"  # part of every key: a change to what an entry holds must not match older entries
# An entry of an older stack (or pristine package) is removed once unused this long, not at once: a proof of another
# checkout may be running its tests on it. A temporary this old is a killed build's.
_KEEP_UNUSED_S = 3600


@dataclass(frozen=True)
class Baseline:
    label: str  # "pristine", or "stack to 0016": the table and the JSON say it
    package: Path  # its vllm folder


def phrase(label: str) -> str:
    """How a problem names a baseline."""
    return "the pristine package" if label == PRISTINE else f"the stack below it ({label.removeprefix('stack ')})"


def baselines(stack: Stack, pristine: Path, ids: Collection[str], pins: Pins) -> dict[str, Baseline]:
    """Patch id -> the package to judge it against, for the patches `ids` of `stack`, building what the cache lacks."""
    identity = ""  # hashed once, and only where some baseline is not the pristine package
    found: dict[str, Baseline] = {}
    for index, patch in enumerate(stack.patches):
        if patch.id not in ids:
            continue
        if index == 0:
            found[patch.id] = Baseline(PRISTINE, pristine)
            continue
        identity = identity or package_identity(pristine)
        below, _ = stack.select(until=stack.patches[index - 1].id)
        found[patch.id] = Baseline(f"stack to {below.patches[-1].id}", _cached(pristine, identity, below, pins))
    return found


def package_identity(package: Path) -> str:
    """sha256 over every file's path and content, bytecode and the stamp aside: a rebuilt twin differs from the last
    one only in its compiled files, and a baseline built from one must not stand in for the other."""
    digest = hashlib.sha256()
    for root, dirs, names in os.walk(package):
        dirs[:] = sorted(name for name in dirs if name != "__pycache__")
        for name in sorted(names):
            path = Path(root) / name
            if not (Path(root) == package and _stamp(name)):
                digest.update(f"{path.relative_to(package).as_posix()}\0{sha256_of(path)}\n".encode())
    return digest.hexdigest()


def _stamp(name: str) -> bool:
    """The pristine package's stamp, or one being written: the copy gets its own, so neither counts nor is copied."""
    return name == STAMP_NAME or fnmatch(name, temp_glob(Path(STAMP_NAME)))


def _cached(pristine: Path, identity: str, below: Stack, pins: Pins) -> Path:
    root = cache_dir() / FOLDER
    key = hashlib.sha256(f"{_FORMAT}\n{identity}\n{below.stack_hash}\n".encode()).hexdigest()[:16]
    entry = root / f"to-{below.patches[-1].id}-{key}"
    if not entry.is_dir():  # an entry exists only once complete (renamed into place)
        _build(pristine, below, pins, entry)
    os.utime(entry)  # used now: _prune keeps it a while for this proof's tests
    _prune(root, entry)
    return entry / "vllm"


def _build(pristine: Path, below: Stack, pins: Pins, entry: Path) -> None:
    entry.parent.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix=f".{entry.name}.tmp-", dir=entry.parent))
    try:
        package = scratch / "vllm"
        shutil.copytree(pristine, package, ignore=lambda folder, names: [
            name for name in names if name == "__pycache__" or (Path(folder) == pristine and _stamp(name))])
        try:
            result = apply_stack(DirSource(path=package), below, pins)
        except UserError as error:  # it names the copy; the folder to fix is the pristine one
            raise UserError(f"--pristine {pristine}, brought to the stack to {below.patches[-1].id} for the proof: "
                            f"{error}") from None
        if result.error:
            raise UserError(f"the stack to {below.patches[-1].id} does not apply to --pristine {pristine}: "
                            f"{result.error}")
        shutil.rmtree(state_dir_for(package))  # its git history: nothing applies to a cache entry again
        try:
            os.rename(scratch, entry)
        except OSError:
            if not entry.is_dir():
                raise
            # Another proof built the same entry first: its files are the same.
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _prune(root: Path, kept: Path) -> None:
    """Entries for the same place in an older stack, and killed builds, once unused for a while: each stack edit
    would otherwise leave a full package copy per patch above it."""
    place = kept.name.rsplit("-", 1)[0] + "-"
    for other in root.iterdir():
        older = other.name.startswith(place) and other != kept
        killed = other.name.startswith(".") and ".tmp-" in other.name
        try:
            idle = time.time() - other.stat().st_mtime
        except FileNotFoundError:
            continue  # pruned by another proof just now
        if (older or killed) and idle > _KEEP_UNUSED_S:
            shutil.rmtree(other, ignore_errors=True)
