"""The non-KV scratch of a stage's profile run, sized by vLLM 0.32.0's own shape functions (run without a GPU):
the fused-MoE modular kernel's workspaces (the experts class's `workspace_shapes`, allocated as
`FusedMoEKernel._allocate_buffers` and `WorkspaceManager.get_simultaneous` do), and the runner's buffers that
outlive the dummy pass (the PP intermediate tensors of a later stage, the last stage's sampler logits).

What stays out: the CUDA-graph pool, which gpu_worker.determine_available_memory takes from a trial capture
(`profile_cudagraph_memory`, applied by default through VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS), and the CUDA
context and NCCL buffers; they are the fitted `fixed_gib` of core.Reserve.
"""

from __future__ import annotations

from math import prod
from typing import Any

import torch
from vllm.model_executor.layers.fused_moe.activation import MoEActivation
from vllm.model_executor.layers.fused_moe.experts.marlin_moe import MarlinExperts
from vllm.model_executor.layers.fused_moe.experts.triton_moe import TritonExperts
from vllm.model_executor.models.utils import make_empty_intermediate_tensors_factory
from vllm.utils.math_utils import round_up

# WorkspaceManager.get_simultaneous rounds each view up to this many bytes.
_ALIGN = 256
# Routed experts at or under this many bits per weight are W4A16 (AWQ int4, NVFP4 on cards without FP4 units):
# vLLM runs them through Marlin (awq_marlin / the NVFP4 Marlin oracle); wider ones take TritonExperts.
_W4A16_BITS = 4.5


def experts_class(moe_backend: str | None, routed_bits: float) -> type:
    """The modular experts class vLLM's MoE oracle picks for the profile: Marlin for `moe_backend: marlin` or W4A16
    experts, TritonExperts otherwise (unquantized and FP8 on SM8x)."""
    return MarlinExperts if moe_backend == "marlin" or routed_bits <= _W4A16_BITS else TritonExperts


def moe_workspace_bytes(cls: type, tokens: int, text: Any, tp: int, act_dtype: torch.dtype = torch.bfloat16) -> int:
    """The MoE scratch of a dummy pass of `tokens` tokens: workspace13 shared with the output, plus workspace2, in
    the experts class's workspace dtype, each rounded as get_simultaneous rounds it. N is what the class's
    moe_problem_size reads off w1/w2: the intermediate size for Marlin (w2's packed rows x 16), gate and up for
    the others (w1's rows); both split over TP."""
    if not getattr(text, "n_routed_experts", 0):
        return 0
    intermediate = text.moe_intermediate_size // tp
    n = intermediate if issubclass(cls, MarlinExperts) else 2 * intermediate
    experts = object.__new__(cls)  # workspace_shapes and workspace_dtype are pure shape functions
    work13, work2, output = experts.workspace_shapes(tokens, n, text.hidden_size, text.num_experts_per_tok,
                                                     text.n_routed_experts, text.n_routed_experts, None,
                                                     MoEActivation.SILU)
    itemsize = experts.workspace_dtype(act_dtype).itemsize
    return sum(round_up(size * itemsize, _ALIGN) for size in (max(prod(work13), prod(output)), prod(work2)))


def runner_buffer_bytes(stage: int, pp: int, tokens: int, max_num_seqs: int, text: Any,
                        act_dtype: torch.dtype = torch.bfloat16) -> int:
    """The runner's buffers on a stage beside the workspaces: a later stage's received intermediate tensors
    (hidden states and residual of max-num-batched-tokens rows, the models' make_empty_intermediate_tensors), and
    on the last stage the dummy sampler's logits, one row per dummy request (compute_logits in the model dtype,
    the sampler's float32 copy)."""
    total = 0
    if stage > 0:
        make = make_empty_intermediate_tensors_factory(["hidden_states", "residual"], text.hidden_size)
        tensors = make(tokens, act_dtype, torch.device("meta")).tensors.values()
        total += sum(tensor.numel() * tensor.element_size() for tensor in tensors)
    if stage == pp - 1:
        total += min(tokens, max_num_seqs) * text.vocab_size * (act_dtype.itemsize + torch.float32.itemsize)
    return total
