"""Fixtures for the SM8x kernel tests: the kernel modules materialised from patches 0008-0010."""

from __future__ import annotations

import pytest

from rigstack.bench import kernel_sources


@pytest.fixture(scope="session")
def _interp_modules():
    return kernel_sources.load(interpret=True)


@pytest.fixture
def interp(_interp_modules, monkeypatch):
    """The modules with their Triton kernels in Triton's CPU interpreter (how CI runs them)."""
    monkeypatch.setenv("TRITON_INTERPRET", "1")  # read again at every launch
    return _interp_modules


@pytest.fixture(scope="session")
def native():
    """The modules compiled for the GPU, plus the patched glm5next kpool module."""
    return kernel_sources.load(interpret=False, with_kpool=True)


OFFLOAD_KERNELS = "vllm/model_executor/layers/fused_moe/expert_offload_kernels.py"


@pytest.fixture(scope="module")
def ko():
    """Patch 0013's expert offload kernels (with 0019's bookkeeping program), their Triton in the interpreter."""
    return kernel_sources.load_module(OFFLOAD_KERNELS, interpret=True)


@pytest.fixture(scope="module")
def kn():
    """The same module compiled for the GPU."""
    return kernel_sources.load_module(OFFLOAD_KERNELS, interpret=False)
