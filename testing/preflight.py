"""Helpers for the preflight tests: profiles written to tmp folders, Contexts with a given GPU scan, and vLLM's
flag/env knowledge learned once per session from the real vllm package of the test interpreter."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from rigstack.preflight import knowledge as knowledge_module
from rigstack.preflight.core import Context, Result, Status
from rigstack.preflight.nvml import Gpu, GpuScan
from rigstack.profiles import Profile, load_profile

NO_GPU = GpuScan((), problem="no NVIDIA driver answered (test)")


def cmp(count: int = 8, memory_gib: float = 63.9, name: str = "NVIDIA CMP 170HX", used_gib: float = 0.3,
        processes: int = 0, link_width: int | None = 4) -> GpuScan:
    return GpuScan(tuple(Gpu(i, name, memory_gib, used_gib, processes, f"0000:0{i}:00.0", link_width)
                         for i in range(count)), driver="610.43.02")


def profile_at(tmp_path: Path, text: str, name: str = "rig") -> Profile:
    path = tmp_path / f"{name}.yaml"
    path.write_text(text)
    return load_profile(path)


def context(profile: Profile | str, *, model: Path | None = None, package: Path | None = None,
            gpus: GpuScan = NO_GPU, environ: dict[str, str] | None = None, **cached: object) -> Context:
    """A Context whose lazily computed parts (gpus, knowledge, stamp, ...) are given instead of measured."""
    if isinstance(profile, str):
        profile = load_profile(profile)
    ctx = Context(profile, model=model, package=package, environ=environ or {})
    ctx.gpus = gpus  # cached_property: an instance attribute set first wins
    for name, value in cached.items():
        setattr(ctx, name, value)
    return ctx


def run(function, ctx: Context) -> Result:  # noqa: ANN001 - any registered check
    return function(ctx)


def assert_status(result: Result, status: Status, *words: str) -> None:
    assert result.status is status, result
    for word in words:
        assert word in result.reason, result


@pytest.fixture(scope="session")
def vllm_knowledge(tmp_path_factory: pytest.TempPathFactory) -> knowledge_module.Knowledge:
    """The real vLLM's flags and env names (one subprocess, 15-60 s), in a private cache."""
    package = knowledge_module.find_package()
    assert package is not None, "the test interpreter has no vllm package"
    old = os.environ.get("RIGSTACK_CACHE")
    os.environ["RIGSTACK_CACHE"] = str(tmp_path_factory.mktemp("cache"))
    try:
        known = knowledge_module.load(package, [])
    finally:
        if old is None:
            os.environ.pop("RIGSTACK_CACHE")
        else:
            os.environ["RIGSTACK_CACHE"] = old
    assert known.error is None, known.error
    return known
