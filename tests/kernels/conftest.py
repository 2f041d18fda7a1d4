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
