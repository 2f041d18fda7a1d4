"""Expert-offload memory in the plan (issue 17, patch 0014): with the profile's per-layer hot-expert cache
(offload.hot_set, which sets VLLM_EXPERT_OFFLOAD) every MoE layer keeps on the GPU only its cache of hot experts and
its staging slots, and every routed expert, the cached ones too, in pinned host RAM (0014's LayerOffload: the host
copy of each expert tensor, then a [cache | staging] device buffer of the expert tensor's shape).

The sizes follow 0014's own rules: the cache is offload.hot_experts_per_layer (VLLM_EXPERT_OFFLOAD_CACHE), else
VLLM_EXPERT_OFFLOAD_BUDGET_GIB spread evenly over the MoE layers; staging is VLLM_EXPERT_OFFLOAD_STAGING (64 unset),
capped at the experts a layer has offloaded. One expert's bytes are its layer's routed-expert bytes over the
experts a layer (weights, scales and biases, per TP rank).
"""

from __future__ import annotations

from dataclasses import dataclass

from rigstack.errors import UserError
from rigstack.offload_model import experts_in_budget
from rigstack.planner import weights as wt
from rigstack.profiles import Profile

GIB = 1024**3
STAGING_ENV = "VLLM_EXPERT_OFFLOAD_STAGING"
BUDGET_ENV = "VLLM_EXPERT_OFFLOAD_BUDGET_GIB"
DEFAULT_STAGING = 64  # patch 0014's default


@dataclass(frozen=True)
class StageOffload:
    moe_layers: int
    cache_per_layer: int
    staging_per_layer: int
    expert_mib: float  # one expert on one TP rank
    gpu_bytes: float  # the stage's caches and staging slots, on each GPU of the stage
    host_bytes: float  # pinned host RAM for the stage's experts, all its TP ranks together


def _layer_experts(sizes: dict[str, float], first: int, end: int, tp: int) -> dict[int, float]:
    """Routed-expert bytes per TP rank of each layer in [first, end)."""
    out: dict[int, float] = {}
    for name, size in sizes.items():
        layer = wt.layer_of(name)
        if layer is not None and first <= layer < end and wt.tensor_class(name) == "routed_experts":
            out[layer] = out.get(layer, 0.0) + size / tp
    return out


def _cache_size(profile: Profile, moe_layers: int, expert_bytes: float, n_experts: int) -> int:
    offload = profile.offload
    assert offload is not None
    budget = profile.env.get(BUDGET_ENV)
    if offload.hot_experts_per_layer is not None:
        size, what = offload.hot_experts_per_layer, f"offload.hot_experts_per_layer {offload.hot_experts_per_layer}"
    elif budget is not None:
        size = experts_in_budget(float(budget) * GIB, moe_layers, expert_bytes)
        what = f"{BUDGET_ENV}={budget} ({size} experts a layer)"
    else:
        raise UserError(f"profile {profile.name}: offload.hot_set is set but no cache size; give "
                        f"offload.hot_experts_per_layer or env {BUDGET_ENV}")
    if size < 1:
        raise UserError(f"profile {profile.name}: {what}: the cache holds no expert a layer; raise it")
    if size >= n_experts:
        raise UserError(f"profile {profile.name}: {what}: a cache of {size} holds the whole layer of {n_experts} "
                        "experts; lower it, or drop offload to keep every expert on the GPU")
    return size


def split(profile: Profile, sizes: dict[str, float], bounds: list[tuple[int, int]], tp: int,
          n_experts: int) -> list[StageOffload] | None:
    """Per stage, what patch 0014 keeps on the GPU and in pinned host RAM; None when the profile does not use it."""
    if profile.offload is None or profile.offload.hot_set is None:
        return None
    staging_raw = profile.env.get(STAGING_ENV, str(DEFAULT_STAGING))
    try:
        staging = int(staging_raw)
    except ValueError:
        raise UserError(f"profile {profile.name}: env {STAGING_ENV}={staging_raw!r} is not a whole number") from None
    if staging < 1:
        raise UserError(f"profile {profile.name}: env {STAGING_ENV}={staging}: the staging buffer needs a slot")
    per_stage = [_layer_experts(sizes, first, end, tp) for first, end in bounds]
    layers = [size for stage in per_stage for size in stage.values()]
    if not layers:
        raise UserError(f"profile {profile.name}: offload is set but the model has no routed experts to offload")
    cache = _cache_size(profile, len(layers), max(layers) / n_experts, n_experts)
    slots = min(staging, n_experts - cache)  # 0014: more slots than offloaded experts is waste
    out = []
    for stage in per_stage:
        expert = max(stage.values(), default=0.0) / n_experts
        out.append(StageOffload(
            moe_layers=len(stage), cache_per_layer=cache, staging_per_layer=slots, expert_mib=expert / 2**20,
            gpu_bytes=sum(size / n_experts * (cache + slots) for size in stage.values()),
            host_bytes=sum(stage.values()) * tp))
    return out
