"""The non-KV scratch of a stage's profile run, sized by vLLM 0.34.0's own shape functions (run without a GPU):
the fused-MoE modular kernel's workspaces (the experts class's `workspace_shapes`, allocated as
`FusedMoEKernel._allocate_buffers` and `WorkspaceManager.get_simultaneous` do), and the runner's buffers that
outlive the dummy pass (the PP intermediate tensors of a later stage, the last stage's sampler logits), and a
DSA model's sparse-MLA workspaces and indexer logits sentinel.

What stays out: the CUDA-graph pool, which vLLM measures rather than shapes (0.34.0's extensible KV cache, on by
default on CUDA, commits the cache from the memory free after capture and warmup; without it
gpu_worker.determine_available_memory takes a trial capture, `profile_cudagraph_memory`), and the CUDA context and
NCCL buffers; they are the fitted `fixed_gib` of core.Reserve.
"""

from __future__ import annotations

import math
from typing import Any


import torch
from vllm.config import VllmConfig
from vllm.model_executor.layers.fused_moe.activation import MoEActivation
from vllm.model_executor.layers.fused_moe.experts.marlin_moe import MarlinExperts
from vllm.model_executor.layers.fused_moe.experts.triton_moe import TritonExperts
from vllm.model_executor.models.utils import make_empty_intermediate_tensors_factory
from vllm.utils.math_utils import round_up

from rigstack.planner import kv
from rigstack.planner.config import text_config
from rigstack.planner.kv import KvSetup

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
    sizes = (max(math.prod(work13), math.prod(output)), math.prod(work2))
    return sum(round_up(size * itemsize, _ALIGN) for size in sizes)


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


# The sparse-MLA backends that reserve no prefill gather workspace: TRITON_MLA_SPARSE (patch 0009; its impl is the
# XPU one, which keeps no workspace), the only sparse backend below SM90 (platforms/cuda.py's priorities).
_NO_GATHER_BACKENDS = ("TRITON_MLA_SPARSE",)


def _dsa(setup: KvSetup) -> bool:
    return setup.architecture in ("GlmMoeDsaForCausalLM", "Glm5NextForCausalLM")


def _sparse_config(setup: KvSetup, hf_config: Any) -> VllmConfig:
    config = kv.vllm_config(setup, hf_config)
    # VllmConfig.__post_init__'s rule for the factor (not run on this stand-in config).
    config.attention_config.sparse_mla_prefill_workspace_factor = 5 if setup.max_model_len <= 256 * 1024 else 2
    return config


def _kpool(setup: KvSetup, text: Any) -> int:
    return getattr(text, "index_kpool", 1) if setup.architecture == "Glm5NextForCausalLM" else 1


def sparse_workspace_bytes(setup: KvSetup, hf_config: Any, backend: str | None = None) -> int:
    """The sparse-MLA scratch a DSA model reserves in vLLM's shared WorkspaceManager during the profile run, sized
    by vLLM's own functions: the indexer's K-gather workspace (sparse_attn_indexer's profile branch:
    _gather_workspace_shapes over max_total_seq_len = get_max_prefill_buffer_size, divided by index_kpool on
    GLM-5.3-Flash, plus the radix top-k scratch), and, unless `backend` reserves none (TRITON_MLA_SPARSE), the
    MLA prefill gather workspace (FlashMLASparseImpl's get_prefill_workspace_size rows of the bf16 latent). They
    scale with max-model-len."""
    if not _dsa(setup):
        return 0
    from vllm.model_executor.layers.indexer_topk import RADIX_TOPK_WORKSPACE_SIZE
    from vllm.model_executor.layers.sparse_attn_indexer import _gather_workspace_shapes
    from vllm.platforms import current_platform
    from vllm.v1.attention.backends.mla.flashmla_sparse import get_prefill_workspace_size
    from vllm.v1.attention.backends.mla.indexer import get_max_prefill_buffer_size

    text = text_config(hf_config)
    config = _sparse_config(setup, hf_config)
    rows = get_max_prefill_buffer_size(config) // _kpool(setup, text)
    values, scales = _gather_workspace_shapes(rows, text.index_head_dim, current_platform.fp8_dtype(), False)
    specs = [values, scales, ((RADIX_TOPK_WORKSPACE_SIZE,), torch.uint8)]
    if backend not in _NO_GATHER_BACKENDS:
        specs.append(((get_prefill_workspace_size(config), text.kv_lora_rank + text.qk_rope_head_dim), torch.bfloat16))
    # WorkspaceManager.get_simultaneous: one allocation, each view rounded up to 256 bytes.
    return sum(round_up(math.prod(shape) * dtype.itemsize, 256) for shape, dtype in specs)


# sparse_attn_indexer's decode logits rows below SM100: whole 256-key KV splits (lcm with 1024 B of FP32 logits).
_DECODE_ROW_ALIGN = 256


def indexer_logits_bytes(setup: KvSetup, hf_config: Any) -> int:
    """The indexer's logits sentinel in the profile run, a plain allocation beside the shared workspace (so added to
    it), in FP32 (indexer_logits_dtype "auto"; no BF16 copy): the larger of VLLM_SPARSE_INDEXER_MAX_LOGITS_MB and the
    worst decode logits x 4 bytes. GLM-5.3-Flash's pooled indexer (models/glm5next): min(max-num-seqs x (1 + draft),
    max-num-batched-tokens) rows of max_model_len / index_kpool keys. GLM-5.3 (sparse_attn_indexer): since 0.34.0
    min(max-num-seqs, max-num-batched-tokens) x (1 + draft) rows of max_model_len rounded up to whole KV splits;
    0.32.0 reserved the cap alone there. (The fused MQA top-k workspaces are SM100-only, not on these rigs.)"""
    if not _dsa(setup):
        return 0
    import vllm.envs as envs

    cap = envs.VLLM_SPARSE_INDEXER_MAX_LOGITS_MB * 1024 * 1024
    draft = setup.num_speculative_tokens + 1
    if setup.architecture != "Glm5NextForCausalLM":
        rows = min(setup.max_num_seqs, setup.max_num_batched_tokens) * draft
        return max(cap, rows * round_up(setup.max_model_len, _DECODE_ROW_ALIGN) * 4)
    tokens = min(setup.max_num_seqs * draft, setup.max_num_batched_tokens)
    return max(cap, tokens * (setup.max_model_len // _kpool(setup, text_config(hf_config))) * 4)
