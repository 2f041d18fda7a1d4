"""What stands in for the few vLLM imports of the package files that kernel_sources loads without vLLM (a GPU host
with torch and Triton alone). Each answers only what those files ask, the way vLLM would on a CUDA machine."""

from __future__ import annotations

import torch


class CudaPlatform:
    """vllm.platforms.current_platform's device questions, answered by torch (capabilities as vLLM's integers, 90 for
    9.0; a family is the major version)."""

    is_cuda = is_cuda_alike = staticmethod(torch.cuda.is_available)

    @staticmethod
    def is_rocm() -> bool:
        return False

    @staticmethod
    def capability() -> int:
        major, minor = torch.cuda.get_device_capability()
        return major * 10 + minor

    @classmethod
    def has_device_capability(cls, capability: tuple[int, int] | int) -> bool:
        if isinstance(capability, tuple):
            return torch.cuda.get_device_capability() >= capability
        return cls.capability() >= capability

    @classmethod
    def is_device_capability_family(cls, capability: int) -> bool:
        return cls.capability() // 10 == capability // 10


def has_flashinfer() -> bool:
    """vllm.utils.flashinfer's check: the lent GPU host has no FlashInfer."""
    return False


class WorkspaceManager:
    """vllm.v1.worker.workspace's manager as the top-k kernels use it: uninitialised scratch (vLLM's is torch.empty
    memory too), fresh each call."""

    @staticmethod
    def get_simultaneous(*shapes_and_dtypes: tuple[tuple[int, ...], torch.dtype]) -> list[torch.Tensor]:
        return [torch.empty(shape, dtype=dtype, device="cuda") for shape, dtype in shapes_and_dtypes]
