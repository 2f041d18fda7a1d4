"""Building the CPU twin's wheel (rigstack.twin says what it is and where it is kept): the sdist and oneDNN's source
unpacked, the twin's patches applied, vLLM's CPU backend compiled against the serving interpreter's torch."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tarfile
import time
from collections.abc import Callable
from pathlib import Path

from rigstack import twin
from rigstack.baseline import Fingerprint, ignore_binaries, tracked_entries, wheel_files
from rigstack.cache import cache_dir
from rigstack.errors import UserError
from rigstack.files import sha256_of
from rigstack.upstreamtests import fetch_sdist
from rigstack.versions import REPO_ROOT, Pins

_STEP = re.compile(r"\[(\d+)/(\d+)\]")
_ERROR = re.compile(r"\berror:|CMake Error")  # gcc's "fatal error:" and "error:", cmake's own


def build(pins: Pins, python: str, on_event: Callable[[str], None], jobs: int | None = None) -> Path:
    """The twin's wheel, from the cache or built: `python` is the serving interpreter, whose torch (the pinned
    TORCH_VERSION) the build compiles against."""
    wheel = twin.cached_wheel(pins)
    if wheel is not None:
        on_event(f"cached: {wheel}")
        return wheel
    target = twin.home(pins)
    if (target / twin.RECORD).is_file():
        on_event(f"the wheel in {target} no longer matches its recorded sha256: rebuilding it")
    onednn = _checked_onednn(pins)
    if not Path("/usr/include/numa.h").is_file():  # vLLM's CPU code links libnuma
        raise UserError("the CPU twin's build needs libnuma's headers (numa.h); apt-get install libnuma-dev")
    sdist = fetch_sdist(pins)
    work = cache_dir() / "twins" / f".build-{twin.key(pins)}"
    shutil.rmtree(work, ignore_errors=True)
    shutil.rmtree(target, ignore_errors=True)
    work.mkdir(parents=True)
    log = work / "build.log"
    jobs = jobs or os.cpu_count() or 1
    on_event(f"building vLLM {pins.vllm_version}'s CPU backend from {sdist.name} (ISA {twin.ISA}, {jobs} jobs); the "
             f"first build takes 15-25 minutes on 2 cores, later runs reuse the wheel; log: {log}")
    source = _unpack(sdist, onednn, work, pins.vllm_version)
    _run([python, "-m", "pip", "install", "-q", "cmake>=3.26.1", "ninja", "setuptools==78.1.1", "setuptools-scm>=8",
          "setuptools-rust>=1.9.0", "wheel", "jinja2>=3.1.6", "regex", "packaging>=24.2"],
         work, log, "installing the build requirements")
    # torch's CUDA build is the one the registry serves; its cmake config wants CUDA's runtime target, which a CPU
    # build never links: an empty stand-in lets it configure.
    shim = work / "cuda-torch-shim.cmake"
    shim.write_text("if(NOT TARGET torch::cudart)\n  add_library(torch::cudart INTERFACE IMPORTED)\nendif()\n")
    env = {**os.environ, "VLLM_TARGET_DEVICE": "cpu", "MAX_JOBS": str(jobs),
           "PATH": f"{Path(python).parent}{os.pathsep}{os.environ.get('PATH', '')}",
           "FETCHCONTENT_SOURCE_DIR_ONEDNN": str(work / "onednn"),
           "CMAKE_ARGS": " ".join((f"-DCMAKE_PROJECT_INCLUDE={shim}", *twin.ONEDNN_OPTIONS))}
    started = time.monotonic()
    _compile([python, "-m", "pip", "wheel", "-v", "--no-build-isolation", "--no-deps", "-w", str(work / "dist"), "."],
             source, env, log, on_event, started)
    built = sorted((work / "dist").glob("vllm-*.whl"))
    if not built:
        raise UserError(f"the twin's build made no wheel; see {log}")
    target.mkdir(parents=True)
    wheel = target / built[0].name
    os.replace(built[0], wheel)
    shutil.copyfile(log, target / "build.log")
    # ninja's own record of each step's start and end: where the next minutes of the build can be found
    for steps in sorted(source.glob("build/*/.ninja_log"))[:1]:
        shutil.copyfile(steps, target / "ninja_log.txt")
    (target / twin.RECORD).write_text(f"{sha256_of(wheel)} {wheel.name}\n")
    shutil.rmtree(work)
    minutes, seconds = divmod(int(time.monotonic() - started), 60)
    on_event(f"built {wheel.name} in {minutes} min {seconds} s")
    return wheel


def fingerprint(wheel: Path) -> str:
    """The twin's Python files' fingerprint, as versions.env pins it (VLLM_FINGERPRINT_CPU)."""
    printer = Fingerprint()
    for _ in tracked_entries(wheel_files(wheel, ignore_binaries), printer):
        pass
    return printer.value


def _checked_onednn(pins: Pins) -> Path:
    tarball = twin.build_inputs() / pins.onednn_src
    if not tarball.is_file():
        raise UserError(f"{tarball} is missing: oneDNN's source, which no package registry carries here, for the "
                        f"CPU twin's build; put it there (or point RIGSTACK_BUILD_INPUTS at its folder)")
    if sha256_of(tarball) != pins.onednn_src_sha256:
        raise UserError(f"{tarball} is not the pinned ONEDNN_SRC_SHA256 ({pins.onednn_src_sha256}); replace it")
    return tarball


def _unpack(sdist: Path, onednn: Path, work: Path, version: str) -> Path:
    with tarfile.open(sdist) as archive:
        archive.extractall(work, filter="data")
    with tarfile.open(onednn) as archive:
        archive.extractall(work / "onednn-src", filter="data")
    (top,) = (work / "onednn-src").iterdir()
    top.rename(work / "onednn")
    for unused in twin.onednn_unused(work / "onednn"):
        unused.unlink()
    source = work / f"vllm-{version}"
    for patch in twin.patches():
        result = subprocess.run(["patch", "-p1", "--forward", "--batch", "-i", str(patch)], cwd=source,
                                capture_output=True, text=True)
        if result.returncode != 0:
            raise UserError(f"{patch.relative_to(REPO_ROOT)} does not apply to {sdist.name} "
                            f"({result.stdout.strip().splitlines()[-1:]}); refresh the twin's patch")
    return source


def _run(command: list[str], cwd: Path, log: Path, step: str) -> None:
    with log.open("a") as out:
        if subprocess.run(command, cwd=cwd, stdout=out, stderr=subprocess.STDOUT).returncode != 0:
            raise UserError(f"the twin's build failed {step}; see {log}")


def _compile(command: list[str], cwd: Path, env: dict[str, str], log: Path, on_event: Callable[[str], None],
             started: float) -> None:
    """Run the build, reporting ninja's [done/total] every 30 s; a failure names the first error line and the log."""
    with log.open("a") as out:
        process = subprocess.Popen(command, cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT)
    while True:
        try:
            process.wait(timeout=30)
            break
        except subprocess.TimeoutExpired:
            steps = _STEP.findall(log.read_text(errors="replace")[-4000:])
            done = f"step {steps[-1][0]} of {steps[-1][1]}" if steps else "configuring"
            on_event(f"{int(time.monotonic() - started) // 60} min: {done}")
        except BaseException:
            process.kill()
            raise
    if process.returncode != 0:
        text = log.read_text(errors="replace").splitlines()
        first = next((line.strip() for line in text if _ERROR.search(line)), "")
        raise UserError(f"the twin's build failed at: {first[:200] or 'see the log'}; log: {log}")
