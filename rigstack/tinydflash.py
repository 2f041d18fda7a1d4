"""A tiny seeded DFlash drafter for the tiny models, and a tiny MLA target for it, built locally (no model hub).

API:
    build_tiny_dflash(target: Path, seed: int = 0, sliding_window: int | None = None) -> Path
        A `DFlashDraftModel` (vLLM's model_executor/models/qwen3_dflash.py) sized for `target` (a tinymodel
        "dense" folder or build_tiny_mla_target's): one non-causal draft layer of the target's attention shape
        (its hidden size, heads, KV heads, head_dim), `fc` over the aux hidden states of TARGET_LAYER_IDS, and,
        like released DFlash drafters, no `embed_tokens` and no `lm_head` in its checkpoint: vLLM shares both
        from the target. Without `sliding_window` the layer keeps full-context KV; with it the layer is
        sliding-window (`dflash_config.use_swa`, `swa_window_size`), like seed 002's and 003's DFlash2 drafters.
        Returns <models_root()>/dflash-<key>/ with config.json and model.safetensors (bf16). Idempotent.
    build_tiny_mla_target(seed: int = 0) -> Path
        A DeepseekV3ForCausalLM of 4 dense layers (hidden 256, 4 heads, 4 KV heads of 64 for the drafter),
        MLA with kv_lora_rank 512 + rope 64 (the 576-wide latent vLLM's CPU MLA kernel compiles for), the dense
        tiny model's tokenizer. Its pages do not unify with a sliding-window drafter's on the CPU twin: an MLA
        page of 16 tokens (CPU_MLA's block) is 18,432 B, the drafter's smallest CPU page (32 tokens x 4 KV heads
        x 64 x K and V in bf16) 32,768 B, not a multiple, and an MLA page cannot be padded.
        Returns <models_root()>/mla-<key>/. Idempotent.

The targets' 4 layers split 2+2 under PP=2; TARGET_LAYER_IDS (0, 2) put one aux layer (vLLM adds 1) on each stage,
so a PP=2 server relays stage 0's aux state to the last stage.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

from rigstack.tinymodel import build_model_dir, build_tiny_model, models_root

BUILD_VERSION = 1
TARGET_LAYER_IDS = (0, 2)
_DRAFT_KEYS = ("hidden_size", "num_attention_heads", "num_key_value_heads", "head_dim", "intermediate_size",
               "vocab_size", "max_position_embeddings", "rms_norm_eps", "hidden_act", "rope_parameters")
# DeepSeek-V3 shaped, every layer dense (first_k_dense_replace = the layer count), no q LoRA, no MTP layer.
_MLA_SHAPE = {"hidden_size": 256, "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 4,
              "head_dim": 64, "intermediate_size": 512, "kv_lora_rank": 512, "q_lora_rank": None,
              "qk_rope_head_dim": 64, "qk_nope_head_dim": 64, "v_head_dim": 64, "first_k_dense_replace": 4,
              "moe_intermediate_size": 128, "n_routed_experts": 8, "num_experts_per_tok": 2, "n_group": 1,
              "topk_group": 1, "num_nextn_predict_layers": 0, "max_position_embeddings": 4096,
              "rms_norm_eps": 1e-6, "tie_word_embeddings": False, "initializer_range": 0.1}
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "generation_config.json")


def _key(inputs: dict) -> str:
    return hashlib.sha256(json.dumps({"build": BUILD_VERSION, **inputs}, sort_keys=True).encode()).hexdigest()[:16]


def _config(target_config: dict, sliding_window: int | None) -> dict:
    shape = {key: target_config[key] for key in _DRAFT_KEYS if key in target_config}
    # The last id as the mask slot: the tokenizer's added tool tags, never in the tests' prompts.
    dflash = {"target_layer_ids": list(TARGET_LAYER_IDS), "mask_token_id": target_config["vocab_size"] - 1}
    if sliding_window is not None:
        dflash.update(use_swa=True, swa_window_size=sliding_window)
    return {"architectures": ["DFlashDraftModel"], "model_type": "qwen3", **shape, "num_hidden_layers": 1,
            "target_hidden_size": target_config["hidden_size"], "tie_word_embeddings": False,
            "torch_dtype": "bfloat16", "dflash_config": dflash}


def _weights(config: dict, seed: int) -> dict:
    import torch

    torch.manual_seed(seed)
    hidden, heads, kv_heads = config["hidden_size"], config["num_attention_heads"], config["num_key_value_heads"]
    head_dim, inter = config["head_dim"], config["intermediate_size"]

    def dense(rows: int, cols: int) -> torch.Tensor:
        return (torch.randn(rows, cols) * 0.1).to(torch.bfloat16)

    def ones(size: int) -> torch.Tensor:
        return torch.ones(size, dtype=torch.bfloat16)

    layer = {"self_attn.q_proj.weight": dense(heads * head_dim, hidden),
             "self_attn.k_proj.weight": dense(kv_heads * head_dim, hidden),
             "self_attn.v_proj.weight": dense(kv_heads * head_dim, hidden),
             "self_attn.o_proj.weight": dense(hidden, heads * head_dim),
             "self_attn.q_norm.weight": ones(head_dim), "self_attn.k_norm.weight": ones(head_dim),
             "mlp.gate_proj.weight": dense(inter, hidden), "mlp.up_proj.weight": dense(inter, hidden),
             "mlp.down_proj.weight": dense(hidden, inter),
             "input_layernorm.weight": ones(hidden), "post_attention_layernorm.weight": ones(hidden)}
    return {**{f"layers.0.{name}": value for name, value in layer.items()},
            "fc.weight": dense(hidden, hidden * len(TARGET_LAYER_IDS)),
            "hidden_norm.weight": ones(hidden), "norm.weight": ones(hidden)}


def build_tiny_dflash(target: Path, seed: int = 0, sliding_window: int | None = None) -> Path:
    """The drafter's folder for the tiny model at `target`, built on first use and cached by its inputs' key."""
    from safetensors.torch import save_file

    target_config = json.loads((target / "config.json").read_text())
    inputs = {"seed": seed, "layers": TARGET_LAYER_IDS,
              "target": {key: target_config.get(key) for key in _DRAFT_KEYS}}
    if sliding_window is not None:  # absent otherwise, so the full-attention drafter keeps its folder
        inputs["sliding_window"] = sliding_window
    final = models_root() / f"dflash-{_key(inputs)}"

    def build(staging: Path) -> None:
        config = _config(target_config, sliding_window)
        save_file(_weights(config, seed), str(staging / "model.safetensors"), metadata={"format": "pt"})
        (staging / "config.json").write_text(json.dumps(config, indent=2) + "\n")

    return build_model_dir(final, build)


def build_tiny_mla_target(seed: int = 0) -> Path:
    """The tiny MLA target's folder, built on first use (with the dense tiny model's tokenizer) and cached."""
    tokenizer_source = build_tiny_model("dense", seed)
    final = models_root() / f"mla-{_key({'seed': seed, 'shape': _MLA_SHAPE, 'tokenizer': tokenizer_source.name})}"

    def build(staging: Path) -> None:
        import torch
        from transformers import AutoConfig, AutoModelForCausalLM

        for name in _TOKENIZER_FILES:
            shutil.copyfile(tokenizer_source / name, staging / name)
        dense = json.loads((tokenizer_source / "config.json").read_text())
        config = AutoConfig.for_model("deepseek_v3", vocab_size=dense["vocab_size"],
                                      eos_token_id=dense["eos_token_id"], pad_token_id=dense["pad_token_id"],
                                      bos_token_id=None, dtype="bfloat16", architectures=["DeepseekV3ForCausalLM"],
                                      **_MLA_SHAPE)
        torch.manual_seed(seed)
        AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16).save_pretrained(staging,
                                                                                       safe_serialization=True)

    return build_model_dir(final, build)
