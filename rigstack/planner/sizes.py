"""The weight bytes vLLM will load, per tensor, from the best source there is:

1. the checkpoint's safetensors headers, when the model folder is here (the shards its
   model.safetensors.index.json names, as vLLM's loader filters them; MTP layers included when MTP is served);
2. else the owner's stated figure: model.rank_gib (what one rank held once loaded), else model.size_gib (the
   files' total), spread over the tensors as the config's shapes x planner.bits spread them;
3. else the config's shapes x planner.bits alone.

A stated size_gib that disagrees with the headers is an error that names both figures. The drafter's weights
follow the same order (headers, planner.drafter_gib, drafter.size_gib, shapes x bits).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rigstack.errors import UserError
from rigstack.planner import weights as wt
from rigstack.planner.config import Drafter, checkpoint_mtp_layers, linear_layers, mtp_layers, text_config
from rigstack.profiles import Profile

GIB = 1024**3
# A stated size_gib is a rounded figure; past this share of the headers' total it is a different checkpoint.
SIZE_TOLERANCE = 0.01
# Tensors of an MTP layer that vLLM shares with the target instead of loading (models/glm5next/common/mtp.py,
# deepseek_mtp: the embedding and the shared head).
_MTP_SHARED = (".embed_tokens.", ".shared_head.head.")


@dataclass(frozen=True)
class Sizes:
    loaded: dict[str, float]  # bytes per tensor vLLM builds, all TP ranks together
    source: str  # where the figures came from, for the plan


def has_checkpoint(folder: Path | None) -> bool:
    return folder is not None and (any(folder.glob("*.safetensors"))
                                   or (folder / "model.safetensors.index.json").is_file())


def _loaded(names: list[str], architecture: str, text: Any, served_mtp: int) -> list[str]:
    """The tensors vLLM builds: every decoder layer's and the embedding, norm and head; the first `served_mtp` MTP
    layers but their shared embedding and head; not the indexer of GLM-5.3's shared-top-k layers."""
    from rigstack.planner.kv import indexer_runs

    layers = text.num_hidden_layers
    kept = []
    for name in names:
        layer = wt.layer_of(name)
        if layer is not None and layer >= layers:
            if layer >= layers + served_mtp or any(part in name for part in _MTP_SHARED):
                continue
        elif (architecture == "GlmMoeDsaForCausalLM" and layer is not None and ".indexer." in name
              and not indexer_runs(text, layer)):
            continue
        kept.append(name)
    return kept


_SHAPES: dict[str, dict[str, int]] = {}


def _shape_params(config: Any) -> dict[str, int]:
    """wt.shape_params, once per config in a process (building the meta model takes seconds)."""
    key = json.dumps(text_config(config).to_dict(), sort_keys=True, default=str)
    if key not in _SHAPES:
        _SHAPES[key] = wt.shape_params(config)
    return _SHAPES[key]


def _with_mtp(params: dict[str, int], config: Any, count: int) -> dict[str, int]:
    """The decoder's parameters plus `count` MTP layers past the last (transformers' classes do not build them):
    each a copy of the last full-attention layer, plus what the NextN module adds around it, as vLLM's
    glm5next/common/mtp.py names it: enorm and hnorm, eh_proj (2 hidden -> hidden) and shared_head (a norm and a
    vocab x hidden head). The checkpoint carries that head; vLLM does not load it (the target's lm_head serves).
    No per-layer embedding copy is counted: seed 000's split (181.3 GiB, 163.3 of it experts) leaves room for one
    vocab x hidden tensor beside the bf16 rest, not two."""
    text = text_config(config)
    linear = linear_layers(config)
    template = max(i for i in range(text.num_hidden_layers) if i not in linear)
    hidden, vocab = text.hidden_size, text.vocab_size
    out = dict(params)
    for i in range(count):
        layer = f"model.layers.{text.num_hidden_layers + i}."
        out.update({name.replace(f"layers.{template}.", f"layers.{text.num_hidden_layers + i}."): size
                    for name, size in params.items() if wt.layer_of(name) == template})
        out.update({layer + "enorm.weight": hidden, layer + "hnorm.weight": hidden,
                    layer + "eh_proj.weight": 2 * hidden * hidden, layer + "shared_head.norm.weight": hidden,
                    layer + "shared_head.head.weight": vocab * hidden})
    return out


def _stated(profile: Profile, architecture: str, text: Any) -> tuple[float, str, bool] | None:
    """The owner's figure as bytes over all ranks, what it says, and whether it counts the checkpoint's MTP layers
    (a files' total does, a rank's loaded target weights do not)."""
    model = profile.model
    if model.rank_gib:
        if profile.parallel.pp > 1:
            raise UserError(f"profile {profile.name}: model.rank_gib is one rank's weights of a single-stage layout, "
                            f"and this profile has PP{profile.parallel.pp}; give model.size_gib (the files' total)")
        return (model.rank_gib * GIB * profile.parallel.tp, f"model.rank_gib {model.rank_gib:g} GiB a rank at TP"
                f"{profile.parallel.tp}", False)
    if model.size_gib:
        return model.size_gib * GIB, f"model.size_gib {model.size_gib:g} GiB", \
            checkpoint_mtp_layers(architecture, text) > 0
    return None


def target_sizes(profile: Profile, config: Any, architecture: str, folder: Path | None) -> Sizes:
    """The bytes of every tensor vLLM loads for the target (all ranks), and their source."""
    text = text_config(config)
    served = mtp_layers(profile, text)
    if has_checkpoint(folder):
        assert folder is not None
        sizes = wt.checkpoint_bytes(folder)
        total = sum(sizes.values())
        stated = profile.model.size_gib
        if stated and abs(total / GIB - stated) > SIZE_TOLERANCE * total / GIB:
            raise UserError(f"profile {profile.name}: model.size_gib is {stated:g} GiB but the safetensors headers "
                            f"in {folder} add up to {total / GIB:.2f} GiB; set size_gib to {total / GIB:.1f}, or "
                            "point model.path (--model) at the checkpoint the profile describes")
        loaded = {name: float(sizes[name]) for name in _loaded(list(sizes), architecture, text, served)}
        return Sizes(loaded, f"checkpoint headers in {folder} ({total / GIB:.2f} GiB of files)")
    bits = dict(profile.planner.bits) if profile.planner else {}
    shown = ", ".join(f"{k} {v:g}" for k, v in sorted(bits.items())) or "all 16"
    stated = _stated(profile, architecture, text)
    counted = max(served, checkpoint_mtp_layers(architecture, text) if stated and stated[2] else 0)
    params = _with_mtp(_shape_params(config), config, counted)
    shapes = wt.sizes_from_shapes(params, bits, linear_layers(config))
    loaded = _loaded(list(shapes), architecture, text, served)
    if stated is None:
        return Sizes({name: shapes[name] for name in loaded},
                     f"config shapes x bits per tensor class ({shown})")
    figure, what, with_mtp = stated
    basis = shapes if with_mtp else {n: shapes[n] for n in _loaded(list(shapes), architecture, text, 0)}
    scale = _scale(profile, figure, what, basis, bits, linear_layers(config), _rounding(profile))
    return Sizes({name: shapes[name] * scale.get(name, 1.0) for name in loaded},
                 f"{what}: the classes planner.bits states ({shown}) at their bits, the rest scaled x"
                 f"{max(scale.values(), default=1.0):.3f} from 16 bits to fill the figure")


def _rounding(profile: Profile) -> float:
    """Half a unit of the stated figure's last digit, in bytes over all ranks: 181.3 GiB is 181.25-181.35."""
    model = profile.model
    value, ranks = (model.rank_gib, profile.parallel.tp) if model.rank_gib else (model.size_gib, 1)
    decimals = len(repr(float(value)).partition(".")[2].rstrip("0"))
    return 0.5 * 10.0 ** -decimals * GIB * ranks


def _scale(profile: Profile, figure: float, what: str, basis: dict[str, float], bits: dict[str, float],
           linear: frozenset[int], rounding: float) -> dict[str, float]:
    """Per tensor, the factor that makes `basis` add up to the owner's figure: the classes whose bits the profile
    states are a format's exact size and stay; the classes it leaves at 16 bits (bf16) take the difference, down
    from 16 bits, never up: a figure that needs more than 16 bits a parameter there (past its own rounding) holds
    tensors the shapes lack, or a class planner.bits should state, and is refused rather than spread."""
    free = [name for name in basis if wt.tensor_class(name, linear) not in bits]
    fixed = sum(size for name, size in basis.items() if name not in set(free))
    rest = sum(basis[name] for name in free)
    if rest <= 0 or figure <= fixed:
        raise UserError(f"profile {profile.name}: {what} is {figure / GIB:.2f} GiB in all, but the tensor classes "
                        f"planner.bits states ({', '.join(sorted(bits))}) alone take {fixed / GIB:.2f} GiB at "
                        "those bits; fix planner.bits or the stated figure")
    if figure - fixed - rest > rounding:
        raise UserError(f"profile {profile.name}: {what} leaves {(figure - fixed) / GIB:.2f} GiB for the tensors "
                        f"planner.bits leaves at 16 bits, {(figure - fixed - rest) / GIB:.2f} GiB more than they "
                        f"hold ({16 * (figure - fixed) / rest:.2f} bits a parameter); state the bits of the "
                        "quantized classes in planner.bits, or check the figure")
    return {name: min(1.0, (figure - fixed) / rest) for name in free}


def drafter_bytes(profile: Profile, draft: Drafter | None, target_hidden: int, pp: int, tp: int) -> float | None:
    """The drafter's weight bytes on the last stage (one rank): its checkpoint headers when its folder is here, else
    planner.drafter_gib, else drafter.size_gib over TP, else its config's shapes x bits["drafter"] (16 unset);
    None when there is no drafter to size."""
    hints = profile.planner
    weights = profile.drafter
    if draft is not None and has_checkpoint(draft.folder):
        assert draft.folder is not None
        total = sum(wt.checkpoint_bytes(draft.folder).values())
        stated = weights.size_gib if weights else None
        if stated and abs(total / GIB - stated) > SIZE_TOLERANCE * total / GIB:
            raise UserError(f"profile {profile.name}: drafter.size_gib is {stated:g} GiB but the safetensors headers "
                            f"in {draft.folder} add up to {total / GIB:.2f} GiB; set size_gib to "
                            f"{total / GIB:.1f}, or point drafter.path at the drafter the profile describes")
        return total / tp
    if hints is not None and hints.drafter_gib:
        return hints.drafter_gib * GIB
    if weights is not None and weights.size_gib and (profile.speculative or {}).get("method") == "dflash":
        return weights.size_gib * GIB / tp
    if draft is None:
        return None
    bits = (hints.bits if hints else {}).get("drafter", wt.DEFAULT_BITS)
    return wt.drafter_params(draft.config, target_hidden, shared_embed=pp == 1) * bits / 8 / tp
