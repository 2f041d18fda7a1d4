"""Cost model of expert offload: decode tokens/s from the hot-expert hit rate and the host link (issue 17).

One request at a time (the seed's decode setting): a step routes each of ``top_k`` picks per MoE layer to an
expert; a pick on an expert in the layer's GPU cache is a hit, every other pick is a distinct missed expert
whose ``expert_bytes`` cross the link before the layer's experts run. The gather of a layer cannot start before
its router has run, so transfer and compute add up (no overlap):

    step = compute_s + layers * top_k * (1 - hit_rate) * expert_bytes / link_rate

Hit rates come from a routing trace (the trace tool), from which experts stay resident (whole layers, as stock
``--cpu-offload-gb`` keeps them: ``resident_hit_rate``), or from a Zipf law fitted to one concentration figure
(``zipf_exponent`` / ``zipf_hit_rate``) where no trace exists yet.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from rigstack.errors import UserError


@dataclass(frozen=True)
class OffloadRig:
    """What the model needs to know about a model on a rig."""

    layers: int  # MoE layers
    experts_per_layer: int
    top_k: int  # experts a token picks per layer
    expert_bytes: float  # one expert's weights and scales
    link_gb_s: float  # the miss gather's rate over the host link, 1e9 bytes/s
    compute_s: float = 0.0  # GPU time of a decode step without the expert transfer

    def __post_init__(self) -> None:
        for name in ("layers", "experts_per_layer", "top_k", "expert_bytes", "link_gb_s"):
            if getattr(self, name) <= 0:
                raise UserError(f"offload model: {name} must be positive, got {getattr(self, name)}")
        if self.top_k > self.experts_per_layer:
            raise UserError(f"offload model: top_k {self.top_k} exceeds the {self.experts_per_layer} experts a layer")
        if self.compute_s < 0:
            raise UserError(f"offload model: compute_s must not be negative, got {self.compute_s}")


def _check_hit_rate(hit_rate: float) -> None:
    if not 0.0 <= hit_rate <= 1.0:
        raise UserError(f"offload model: hit rate {hit_rate} is outside [0, 1]")


def misses_per_step(rig: OffloadRig, hit_rate: float) -> float:
    """Expected experts a decode step copies over the link (all layers)."""
    _check_hit_rate(hit_rate)
    return rig.layers * rig.top_k * (1.0 - hit_rate)


def transfer_seconds(rig: OffloadRig, hit_rate: float) -> float:
    return misses_per_step(rig, hit_rate) * rig.expert_bytes / (rig.link_gb_s * 1e9)


def decode_tok_s(rig: OffloadRig, hit_rate: float) -> float:
    """Predicted decode tokens/s of one request."""
    return 1.0 / (rig.compute_s + transfer_seconds(rig, hit_rate))


def fit_compute_s(rig: OffloadRig, hit_rate: float, tok_s: float) -> float:
    """The per-step compute that makes the model give a measured ``tok_s`` at ``hit_rate``."""
    compute = 1.0 / tok_s - transfer_seconds(rig, hit_rate)
    if compute < 0:
        raise UserError(f"offload model: {tok_s} tok/s at hit rate {hit_rate} is faster than the link allows")
    return compute


def implied_hit_rate(rig: OffloadRig, tok_s: float) -> float:
    """The hit rate at which the model gives a measured ``tok_s`` (inverse of ``decode_tok_s``)."""
    per_miss = rig.expert_bytes / (rig.link_gb_s * 1e9)
    misses = (1.0 / tok_s - rig.compute_s) / per_miss
    return 1.0 - misses / (rig.layers * rig.top_k)


def implied_link_gb_s(rig: OffloadRig, hit_rate: float, tok_s: float) -> float:
    """The gather rate at which the model gives a measured ``tok_s`` at ``hit_rate``."""
    seconds = 1.0 / tok_s - rig.compute_s
    if seconds <= 0:
        raise UserError(f"offload model: {tok_s} tok/s leaves no time for the transfer after compute_s")
    return misses_per_step(rig, hit_rate) * rig.expert_bytes / seconds / 1e9


def resident_hit_rate(rig: OffloadRig, offloaded_bytes: float) -> float:
    """Hit rate where whole layers stay on the GPU (stock --cpu-offload-gb): the resident share of the experts."""
    total = rig.layers * rig.experts_per_layer * rig.expert_bytes
    if not 0 <= offloaded_bytes <= total:
        raise UserError(f"offload model: {offloaded_bytes:.4g} bytes offloaded, but the experts hold {total:.4g}")
    return 1.0 - offloaded_bytes / total


def experts_in_budget(budget_bytes: float, layers: int, expert_bytes: float) -> int:
    """Experts a layer that a budget spread evenly over the layers' caches holds (patch 0014's _BUDGET_GIB rule)."""
    return int(budget_bytes // (layers * expert_bytes))


def cache_experts_for_budget(rig: OffloadRig, budget_bytes: float) -> int:
    """Hot experts per layer that a GPU budget for the caches of all layers holds."""
    per_layer = experts_in_budget(budget_bytes, rig.layers, rig.expert_bytes)
    if per_layer < 1:
        raise UserError(f"offload model: a cache budget of {budget_bytes / 2**30:.2f} GiB holds no expert per layer "
                        f"({rig.layers} layers x {rig.expert_bytes / 2**20:.1f} MiB); raise the budget")
    return min(per_layer, rig.experts_per_layer)


def zipf_hit_rate(n_experts: int, cached: int, exponent: float) -> float:
    """Share of picks taken by the ``cached`` most-picked of ``n_experts`` experts under a Zipf law."""
    weights = [rank ** -exponent for rank in range(1, n_experts + 1)]
    return sum(weights[:cached]) / sum(weights)


def zipf_exponent(n_experts: int, top_fraction: float, share: float) -> float:
    """The Zipf exponent under which the hottest ``top_fraction`` of the experts take ``share`` of the picks."""
    top = round(top_fraction * n_experts)
    if not 0 < top < n_experts or not top / n_experts < share < 1:
        raise UserError(f"offload model: the hottest {top_fraction:.0%} taking {share:.0%} of the picks is not a "
                        "concentration a Zipf law can fit (need top share above the top fraction, below 100%)")
    lo, hi = 0.0, 8.0
    for _ in range(60):  # bisection: the share grows with the exponent
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if zipf_hit_rate(n_experts, top, mid) < share else (lo, mid)
    return (lo + hi) / 2


def overlapped_layers_s(compute_s: float, per_expert_s: float, staged: Sequence[float],
                        prefetched: Sequence[float]) -> float:
    """One decode step over consecutive offloaded layers with prefetch (patch 0019), in seconds.

    Layer l first gathers its ``staged[l]`` misses (they wait for its router), then computes for ``compute_s`` while
    the ``prefetched[l]`` experts it gathers for layer l + 1 cross the link, and ends when both are done:
    ``staged x per_expert + max(compute, prefetched x per_expert)``. Nothing prefetched is the serial model.
    """
    if len(staged) != len(prefetched):
        raise UserError(f"offload model: {len(staged)} layers of staged misses, {len(prefetched)} of prefetches")
    return sum(m * per_expert_s + max(compute_s, f * per_expert_s) for m, f in zip(staged, prefetched))


def prefetch_decode_tok_s(rig: OffloadRig, hit_rate: float, accuracy: float, slots: float) -> float:
    """Predicted decode tokens/s of one request with prefetch: a layer misses m = top_k (1 - hit_rate) experts, the
    layer before it prefetched min(m, slots) experts of which ``accuracy`` were right (the first layer has none
    before it, the last prefetches for none), and the prefetch runs beside the whole of a layer's compute (the
    rig's compute_s over its layers: an upper bound where only the MoE kernel overlaps)."""
    _check_hit_rate(hit_rate)
    if not 0.0 <= accuracy <= 1.0 or slots < 0:
        raise UserError(f"offload model: accuracy {accuracy} must be in [0, 1] and slots {slots} not negative")
    m = rig.top_k * (1.0 - hit_rate)
    f = min(m, slots)
    staged = [m] + [m - accuracy * f] * (rig.layers - 1)
    prefetched = [f] * (rig.layers - 1) + [0.0]
    per_expert = rig.expert_bytes / (rig.link_gb_s * 1e9)
    return 1.0 / overlapped_layers_s(rig.compute_s / rig.layers, per_expert, staged, prefetched)
