"""The tiny MLA target and sliding-window DFlash drafter of rigstack.tinydflash, as vLLM sees them in process:
its real engine config and each KV layer's spec built by the real layer (patches 0016 and 0017's tests).

    engine_config(window, seqs) -> VllmConfig   vLLM's EngineArgs config for the pair (CPU_MLA, 16-token blocks)
    layer_specs(config) -> dict                 {layer name: KVCacheSpec}: the target's MLA layers from vLLM's
                                                loader, the drafter's layer as DFlashQwen3Attention builds its
                                                Attention; needs a model-parallel group (single_rank_dist)
    resolve_layout(config, specs)               the engine core's layout choice from the pair's CPU backends
    no_accelerator()                            torch.accelerator as the CPU worker leaves it before a load
"""

from __future__ import annotations

from typing import Any

from rigstack.tinydflash import build_tiny_dflash, build_tiny_mla_target
from rigstack.twinconfig import rigs_runner


def engine_config(window: int, seqs: int) -> Any:
    from vllm.engine.arg_utils import EngineArgs

    target = build_tiny_mla_target()
    draft = build_tiny_dflash(target, sliding_window=window)
    with rigs_runner():  # the twin's standalone runner would refuse the drafter; the rigs' V2 runner takes it
        return EngineArgs(model=str(target), dtype="bfloat16", max_model_len=2048, max_num_seqs=seqs,
                          block_size=16, attention_backend="CPU_MLA",
                          speculative_config={"method": "dflash", "model": str(draft), "num_speculative_tokens": 3}
                          ).create_engine_config()


def _drafter_layer(config: Any, first: int) -> Any:
    from vllm.model_executor.layers.attention import Attention
    from vllm.model_executor.models.qwen3_dflash import _resolve_layer_attention

    draft = config.speculative_config.draft_model_config.hf_config
    window, _ = _resolve_layer_attention(draft, 0)
    # DFlashQwen3Model numbers its layers after the target's.
    return Attention(draft.num_attention_heads, draft.head_dim, draft.head_dim**-0.5,
                     num_kv_heads=draft.num_key_value_heads, cache_config=config.cache_config,
                     per_layer_sliding_window=window, prefix=f"model.layers.{first}.self_attn.attn")


def no_accelerator() -> None:
    """What the CPU worker does before loading a model: no accelerator to synchronize or empty caches on (vLLM 0.34.0
    patches torch.accelerator when this module is imported; 0.32.0 had cpu_model_runner's function for it)."""
    import vllm.v1.worker.cpu.shm  # noqa: F401


def layer_specs(config: Any) -> dict:
    from vllm.config import get_layers_from_vllm_config, set_current_vllm_config
    from vllm.model_executor.layers.attention.mla_attention import MLAAttention
    from vllm.model_executor.model_loader import get_model

    no_accelerator()
    with set_current_vllm_config(config):
        get_model(vllm_config=config)
        layers = dict(get_layers_from_vllm_config(config, MLAAttention))
        drafter = _drafter_layer(config, len(layers))
        layers[drafter.layer_name] = drafter
        return {name: layer.get_kv_cache_spec(config) for name, layer in layers.items()}


def resolve_layout(config: Any, specs: dict) -> Any:
    from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackend
    from vllm.v1.attention.backends.mla.cpu_mla import CPUMLABackend
    from vllm.v1.attention.backends.utils import get_supported_kv_cache_layouts, resolve_kv_cache_layout

    supported = [layout.name for layout in get_supported_kv_cache_layouts([CPUMLABackend, CPUAttentionBackend])]
    return resolve_kv_cache_layout(config, [supported], list(specs.values()))
