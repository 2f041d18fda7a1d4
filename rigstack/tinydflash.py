"""A tiny seeded DFlash drafter for the tiny dense model, built locally (no model hub).

API:
    build_tiny_dflash(target: Path, seed: int = 0) -> Path
        A `DFlashDraftModel` (vLLM's model_executor/models/qwen3_dflash.py) sized for `target` (a tinymodel
        "dense" folder): one non-causal draft layer of the target's attention shape, `fc` over the aux hidden
        states of TARGET_LAYER_IDS, and, like released DFlash drafters, no `embed_tokens` and no `lm_head` in its
        checkpoint: vLLM shares both from the target. No sliding window (full-context drafter KV).
        Returns <models_root()>/dflash-<key>/ with config.json and model.safetensors (bf16). Idempotent.

The target's 4 layers split 2+2 under PP=2; TARGET_LAYER_IDS (0, 2) put one aux layer (vLLM adds 1) on each stage,
so a PP=2 server relays stage 0's aux state to the last stage.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from rigstack.tinymodel import build_model_dir, models_root

BUILD_VERSION = 1
TARGET_LAYER_IDS = (0, 2)
_DRAFT_KEYS = ("hidden_size", "num_attention_heads", "num_key_value_heads", "head_dim", "intermediate_size",
               "vocab_size", "max_position_embeddings", "rms_norm_eps", "hidden_act", "rope_parameters")


def _key(target_config: dict, seed: int) -> str:
    inputs = {"build": BUILD_VERSION, "seed": seed, "layers": TARGET_LAYER_IDS,
              "target": {key: target_config.get(key) for key in _DRAFT_KEYS}}
    return hashlib.sha256(json.dumps(inputs, sort_keys=True).encode()).hexdigest()[:16]


def _config(target_config: dict) -> dict:
    shape = {key: target_config[key] for key in _DRAFT_KEYS if key in target_config}
    return {"architectures": ["DFlashDraftModel"], "model_type": "qwen3", **shape, "num_hidden_layers": 1,
            "target_hidden_size": target_config["hidden_size"], "tie_word_embeddings": False,
            "torch_dtype": "bfloat16",
            # The last id as the mask slot: the tokenizer's added tool tags, never in the tests' prompts.
            "dflash_config": {"target_layer_ids": list(TARGET_LAYER_IDS),
                              "mask_token_id": target_config["vocab_size"] - 1}}


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


def build_tiny_dflash(target: Path, seed: int = 0) -> Path:
    """The drafter's folder for the tiny model at `target`, built on first use and cached by its inputs' key."""
    from safetensors.torch import save_file

    target_config = json.loads((target / "config.json").read_text())
    final = models_root() / f"dflash-{_key(target_config, seed)}"

    def build(staging: Path) -> None:
        config = _config(target_config)
        save_file(_weights(config, seed), str(staging / "model.safetensors"), metadata={"format": "pt"})
        (staging / "config.json").write_text(json.dumps(config, indent=2) + "\n")

    return build_model_dir(final, build)
