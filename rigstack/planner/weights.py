"""Weight bytes per pipeline stage: exact from a checkpoint's safetensors headers, else the architecture's tensor
shapes (transformers' own model class built on the meta device, so no memory is used) times bits per tensor class.

Tensors map to stages the way vLLM places them under PP: decoder layer N on the stage holding N, the embedding on
the first stage, the final norm and lm_head on the last. Tensors vLLM does not build are left out (the indexer of
GLM-5.3's shared-top-k layers). Under TP every rank is taken to hold 1/tp of every tensor (replicated small
tensors, such as norms and the indexer's wk, are undercounted by at most a few MiB per layer).
"""

from __future__ import annotations

import json
import re
import struct
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from rigstack.errors import UserError

# Tensor classes, in the order their patterns are tried (the first match wins).
CLASSES: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("routed_experts", re.compile(r"\.mlp\.experts\.")),
    ("shared_experts", re.compile(r"\.mlp\.shared_experts?\.")),
    ("router", re.compile(r"\.mlp\.gate\.(weight|e_score_correction_bias)$")),
    ("dense_mlp", re.compile(r"\.mlp\.(gate_proj|up_proj|down_proj|gate_up_proj)\.")),
    ("attention", re.compile(r"\.(self_attn|attn_hc|ffn_hc)\.")),
    ("embed", re.compile(r"embed_tokens\.")),
    ("head", re.compile(r"(^|\.)(lm_head|shared_head\.head)\.")),  # an MTP layer's own head is a head too
)
# Bits per parameter when a profile says nothing: the unquantized checkpoint (bf16).
DEFAULT_BITS = 16.0
_LAYER = re.compile(r"(?:^|\.)layers\.(\d+)\.")
_DTYPE_BYTES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U8": 1,
                "F8_E4M3": 1, "F8_E5M2": 1, "BOOL": 1, "U32": 4, "U16": 2, "F8_E8M0": 1, "F4": 0.5}


def tensor_class(name: str, linear_layers: frozenset[int] = frozenset()) -> str:
    """The class of a tensor; attention tensors of linear-attention (KDA) layers are their own class."""
    for label, pattern in CLASSES:
        if pattern.search(name):
            if label == "attention" and layer_of(name) in linear_layers:
                return "linear_attention"
            return label
    return "other"  # norms, biases: kept in the model dtype


def layer_of(name: str) -> int | None:
    found = _LAYER.search(name)
    return int(found.group(1)) if found else None


def checkpoint_bytes(folder: Path) -> dict[str, int]:
    """Exact bytes of every tensor, read from the safetensors headers (8-byte length, then JSON): the shards the
    index names when there is one (vLLM's loader drops files the index does not name), else every shard."""
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        try:
            shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        except (ValueError, KeyError, TypeError, AttributeError):
            raise UserError(f"{index}: not a safetensors index (no weight_map); re-download the checkpoint") from None
    else:
        shards = sorted(path.name for path in folder.glob("*.safetensors"))
    if not shards:
        raise UserError(f"{folder}: no safetensors files; download the checkpoint or drop --model to plan from "
                        "the config")
    sizes: dict[str, int] = {}
    for shard in shards:
        path = folder / shard
        if not path.is_file():
            raise UserError(f"{index}: names shard {shard}, which is missing from {folder}; finish the download")
        sizes.update(_header_sizes(path))
    return sizes


def _header_sizes(path: Path) -> dict[str, int]:
    try:
        with path.open("rb") as handle:
            (length,) = struct.unpack("<Q", handle.read(8))
            header = json.loads(handle.read(length))
        return {name: meta["data_offsets"][1] - meta["data_offsets"][0]
                for name, meta in header.items() if name != "__metadata__"}
    except (struct.error, ValueError, KeyError, TypeError, IndexError, MemoryError, OverflowError):
        raise UserError(f"{path}: its safetensors header cannot be read (a partial or corrupt download); "
                        "re-download that shard") from None


def shape_params(hf_config: Any) -> dict[str, int]:
    """Parameter count of every tensor of transformers' model class for this config, built on the meta device."""
    import torch
    from transformers import AutoModelForCausalLM

    text = getattr(hf_config, "text_config", None) or hf_config
    with torch.device("meta"):
        if type(text).__name__ == "Glm5NextTextConfig":
            # The text model of the multimodal class; its lm_head is one vocab x hidden matrix.
            from transformers.models.glm5_next.modeling_glm5_next import Glm5NextTextModel

            model = Glm5NextTextModel(text)
            extra = {"lm_head.weight": text.vocab_size * text.hidden_size}
            prefix = "model."
        else:
            model, extra, prefix = AutoModelForCausalLM.from_config(text), {}, ""
    params = {prefix + name: tensor.numel() for name, tensor in model.named_parameters()}
    return {**params, **extra}


def stage_bytes(sizes: dict[str, float], bounds: list[tuple[int, int]], skip: Iterable[str] = (),
                tp: int = 1, linear_layers: frozenset[int] = frozenset()) -> list[dict[str, float]]:
    """Bytes per tensor class per stage (a tensor outside every layer goes to the first or last stage)."""
    skipped = set(skip)
    out: list[dict[str, float]] = [{} for _ in bounds]
    last = len(bounds) - 1
    for name, size in sizes.items():
        if name in skipped:
            continue
        layer = layer_of(name)
        if layer is None:
            stage = 0 if "embed_tokens" in name else last
        else:
            stage = next((i for i, (first, end) in enumerate(bounds) if first <= layer < end), last)
        label = tensor_class(name, linear_layers)
        out[stage][label] = out[stage].get(label, 0.0) + size / tp
    return out


def sizes_from_shapes(params: dict[str, int], bits: dict[str, float],
                      linear_layers: frozenset[int] = frozenset()) -> dict[str, float]:
    return {name: count * bits.get(tensor_class(name, linear_layers), bits.get("other", DEFAULT_BITS)) / 8
            for name, count in params.items()}


def drafter_params(draft_config: Any, target_hidden: int, shared_embed: bool) -> int:
    """Parameters vLLM builds for a DFlash drafter (models/qwen3_dflash.py DFlashQwen3Model): its Qwen3 decoder
    layers and norms (transformers' class on the meta device), the fc that maps the target's aux hidden states
    (target hidden x aux layers, from dflash_config.target_layer_ids) to its width, and hidden_norm. It shares the
    target's lm_head unless has_own_lm_head; its embedding is the target's (maybe_share_target_embed) except under
    PP, where the last stage has none to share and the drafter loads its own copy (seed 002: "the draft
    embed_tokens ... loaded from the checkpoint"). DFlash2's small grouped-conv taps are not counted."""
    params = shape_params(draft_config)
    aux = len((getattr(draft_config, "dflash_config", None) or {}).get("target_layer_ids") or ()) \
        or draft_config.num_hidden_layers
    hidden = draft_config.hidden_size
    kept = sum(count for name, count in params.items()
               if not (name.startswith("lm_head.") and not getattr(draft_config, "has_own_lm_head", False))
               and not ("embed_tokens" in name and shared_embed))
    return kept + target_hidden * aux * hidden + hidden
