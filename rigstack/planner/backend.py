"""Which attention backend vLLM's own CUDA selector picks for a rig: CudaPlatform.get_valid_backends (cuda.py's
priorities, then each backend's validate_configuration) for the profile's compute capability, KV dtype, head size
and block size, run without a GPU.

cuda.py imports vLLM's compiled CUDA ops at module level, which the CPU twin lacks: there a placeholder module
stands in for that import while cuda.py loads, and is removed again afterwards. Backends whose own import fails
here (their CUDA extension or FlashInfer is not installed) cannot be checked and are listed as such, apart from
the ones that were checked and found invalid for the configuration.
"""

from __future__ import annotations

import importlib
import sys
import types
from typing import Any

_EXTENSION = "vllm._C_stable_libtorch"
# Reasons that say the backend's code is missing from this interpreter, not that the configuration is wrong.
_UNAVAILABLE = ("ImportError", "ModuleNotFoundError", "requires the CUDA", "requires FlashInfer")


def _cuda_platform() -> Any:
    added = []
    try:
        importlib.import_module(_EXTENSION)
    except ImportError:
        sys.modules[_EXTENSION] = types.ModuleType(_EXTENSION)
        added = [_EXTENSION, "vllm.platforms.cuda"]
    try:
        return importlib.import_module("vllm.platforms.cuda").CudaPlatform
    finally:
        for name in added:
            sys.modules.pop(name, None)


def select(capability: float, head_size: int, kv_cache_dtype: str, block_size: int, num_heads: int,
           use_mla: bool, use_sparse: bool, forced: str | None = None) -> dict[str, Any]:
    """{"picked": name or None, "valid": [...], "invalid": {name: reasons}, "unchecked": {name: reasons},
    "outranked_by_unchecked": [...], "forced": name or None}: the picked one holds unless an unchecked,
    higher-ranked backend accepts. With `forced` (the profile's --attention-backend) vLLM ranks nothing: that
    backend is picked if valid, and only it can be unchecked."""
    import torch
    from vllm.platforms.interface import DeviceCapability
    from vllm.v1.attention.selector import AttentionSelectorConfig

    major, minor = int(capability), round(capability * 10) % 10
    config = AttentionSelectorConfig(head_size=head_size, dtype=torch.bfloat16, kv_cache_dtype=kv_cache_dtype,
                                     block_size=block_size, use_mla=use_mla, use_sparse=use_sparse)
    valid, invalid = _cuda_platform().get_valid_backends(DeviceCapability(major, minor), config, num_heads=num_heads)
    checked, unchecked, ranks = {}, {}, {}
    for backend, (rank, reasons) in invalid.items():
        # Unchecked only if every reason is missing code: one about the configuration rules it out anyway.
        missing = all(any(word in reason for word in _UNAVAILABLE) for reason in reasons)
        (unchecked if missing else checked)[backend.name] = reasons
        ranks[backend.name] = rank
    ranked = sorted(valid, key=lambda candidate: candidate.priority)
    names = [c.backend.name for c in ranked]
    if forced:
        return {"picked": forced if forced in names else None, "valid": names, "invalid": checked,
                "unchecked": {forced: unchecked[forced]} if forced in unchecked else {},
                "outranked_by_unchecked": [], "forced": forced}
    top = ranked[0].priority if ranked else len(ranks) + len(valid)
    return {"picked": names[0] if names else None, "valid": names, "invalid": checked, "unchecked": unchecked,
            "outranked_by_unchecked": [name for name in unchecked if ranks[name] < top], "forced": None}
