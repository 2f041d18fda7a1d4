"""Expert-offload memory in the plan (issue 17, patches 0014 and 0019): with the profile's per-layer hot-expert cache
(offload.hot_set, which sets VLLM_EXPERT_OFFLOAD) every MoE layer keeps on the GPU only its cache of hot experts, its
prefetch area and its staging slots, and every routed expert, the cached ones too, in pinned host RAM (LayerOffload:
the host copy of each expert tensor, then a [cache | prefetch | staging] device buffer of the expert tensor's shape).

The sizes follow the patches' own rules: the cache is offload.hot_experts_per_layer (VLLM_EXPERT_OFFLOAD_CACHE), else
what VLLM_EXPERT_OFFLOAD_BUDGET_GIB holds after the prefetch areas, spread evenly over the MoE layers; the prefetch
area is VLLM_EXPERT_OFFLOAD_PREFETCH slots (0019; 0 unset), at most the experts a layer has offloaded; staging is
VLLM_EXPERT_OFFLOAD_STAGING (64 unset), capped at the experts a layer has offloaded, and with 0019's shared staging
(VLLM_EXPERT_OFFLOAD_SHARED_STAGING, 1 unset) one region a stage (a process) serves every layer, so its slots count
once, at the stage's largest expert; 0 gives every layer its own. One expert's bytes are its layer's routed-expert
bytes over the experts a layer (weights, scales and biases, per TP rank). Not counted: the mappings' rounding to the
driver's granularity (2 MiB on CUDA), under 2 MiB a tensor a layer.
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
PREFETCH_ENV = "VLLM_EXPERT_OFFLOAD_PREFETCH"
SHARED_ENV = "VLLM_EXPERT_OFFLOAD_SHARED_STAGING"
DEFAULT_STAGING = 64  # patch 0014's default


@dataclass(frozen=True)
class StageOffload:
    moe_layers: int
    cache_per_layer: int
    prefetch_per_layer: int
    staging_per_layer: int
    shared_staging: bool  # one staging region for the stage's layers (0019), else one a layer
    expert_mib: float  # one expert on one TP rank
    gpu_bytes: float  # the stage's caches, prefetch areas and staging slots, on each GPU of the stage
    host_bytes: float  # pinned host RAM for the stage's experts, all its TP ranks together


def _layer_experts(sizes: dict[str, float], first: int, end: int, tp: int) -> dict[int, float]:
    """Routed-expert bytes per TP rank of each layer in [first, end)."""
    out: dict[int, float] = {}
    for name, size in sizes.items():
        layer = wt.layer_of(name)
        if layer is not None and first <= layer < end and wt.tensor_class(name) == "routed_experts":
            out[layer] = out.get(layer, 0.0) + size / tp
    return out


def _cache_size(profile: Profile, moe_layers: int, expert_bytes: float, n_experts: int, prefetch: int) -> int:
    offload = profile.offload
    assert offload is not None
    budget = profile.env.get(BUDGET_ENV)
    if offload.hot_experts_per_layer is not None:
        size, what = offload.hot_experts_per_layer, f"offload.hot_experts_per_layer {offload.hot_experts_per_layer}"
    elif budget is not None:
        areas = moe_layers * prefetch * expert_bytes  # 0019: the prefetch areas come out of the budget first
        if areas >= float(budget) * GIB:
            raise UserError(f"profile {profile.name}: env {PREFETCH_ENV}={prefetch}: the prefetch areas "
                            f"({areas / GIB:.2f} GiB) take all of {BUDGET_ENV}={budget}; lower it or raise the budget")
        size = experts_in_budget(float(budget) * GIB - areas, moe_layers, expert_bytes)
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
    staging = _whole(profile, STAGING_ENV, DEFAULT_STAGING, 1, "the staging buffer needs a slot")
    prefetch = _whole(profile, PREFETCH_ENV, 0, 0, "give the prefetch slots a layer (0 or unset: off)")
    raw = profile.env.get(SHARED_ENV, "1").strip() or "1"
    if raw not in ("0", "1"):
        raise UserError(f"profile {profile.name}: env {SHARED_ENV}={raw!r}: give 1 (one staging region for all "
                        "layers, the default) or 0 (staging slots of its own for each layer)")
    shared = raw == "1"
    per_stage = [_layer_experts(sizes, first, end, tp) for first, end in bounds]
    layers = [size for stage in per_stage for size in stage.values()]
    if not layers:
        raise UserError(f"profile {profile.name}: offload is set but the model has no routed experts to offload")
    cache = _cache_size(profile, len(layers), max(layers) / n_experts, n_experts, prefetch)
    if prefetch > n_experts - cache:
        raise UserError(f"profile {profile.name}: env {PREFETCH_ENV}={prefetch}: more prefetch slots than the "
                        f"{n_experts - cache} experts a layer offloads; lower it")
    slots = min(staging, n_experts - cache)  # 0014: more slots than offloaded experts is waste
    out = []
    for stage in per_stage:
        expert = max(stage.values(), default=0.0) / n_experts
        own = cache + prefetch + (0 if shared else slots)  # slots a layer holds alone; the shared region once
        out.append(StageOffload(
            moe_layers=len(stage), cache_per_layer=cache, prefetch_per_layer=prefetch, staging_per_layer=slots,
            shared_staging=shared, expert_mib=expert / 2**20,
            gpu_bytes=sum(size / n_experts * own for size in stage.values()) + (expert * slots if shared else 0.0),
            host_bytes=sum(stage.values()) * tp))
    return out


def _whole(profile: Profile, name: str, default: int, least: int, fix: str) -> int:
    """A whole-number env setting of the patches, refused as the patch would refuse it."""
    raw = profile.env.get(name, str(default))
    try:
        value = int(raw)
    except ValueError:
        raise UserError(f"profile {profile.name}: env {name}={raw!r} is not a whole number") from None
    if value < least:
        raise UserError(f"profile {profile.name}: env {name}={value}: {fix}")
    return value
