"""The seeds' published KV pools against the planner: `python -m rigstack plan-published` (serving interpreter)
prints the README's table. The planner's one fitted constant, fixed_gib, is fitted on all the measured cases jointly
(planner.heldout, `plan-published --held-out`, which also plans each case with the fit that left it out); no
constant is fitted on a single case, and a profile's utilisation is never a fitted value.

Each case is a profile plus the changes that make it the configuration the seed measured (deep-merged over the
profile, as `extends:` would).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from rigstack.planner.core import RESERVE, DrafterKv, Plan, Request, Reserve, plan
from rigstack.planner.usable import usable
from rigstack.planner.verdict import error_bar_tokens, judge
from rigstack.profiles import Profile, leaves, load_profile, merge

# Seed 001's FP8 checkpoint: linear layers FP8 (block scales add 0.002 bits); vLLM keeps the KDA and MLA
# projections in BF16 (models/glm5next: "fp8 checkpoints omit their scales", "MLA projections are BF16").
_FP8 = {"routed_experts": 8, "shared_experts": 8, "dense_mlp": 8, "router": 16, "attention": 16,
        "linear_attention": 16}
# Its step 9 EXL3 experts: "Expert weights dropped from 39 GiB to 23 GiB per GPU", 8 x 23 / 39 bits.
_EXL3_BITS = 8 * 23 / 39


# Seed 001 publishes no gpu-memory-utilization: its engine set none, and vLLM 0.31's CacheConfig defaulted to 0.92.
# An assumption (the seed does not say), never a fit.
SEED001_ENGINE_UTIL = 0.92
# The seed's checkpoints are not the profile's NVFP4 one, whose size_gib would otherwise size them.
_L40_BASE = {"vllm": {"kv-cache-dtype": "auto", "speculative-config": None,
                      "gpu-memory-utilization": SEED001_ENGINE_UTIL},
             "planner": {"bits": _FP8}, "model": {"size_gib": None}}
_MTP = {"kv-cache-dtype": "fp8", "speculative-config": {"method": "mtp", "num_speculative_tokens": 3}}
# Seed 002's engine (its patch 0024) drew the drafter's sidecar ids from the pool at 256-token blocks; its logged
# pool (6.62M, "about 6.3 concurrent 1M requests") is vLLM's get_kv_cache_capacity over core and sidecar ids.
_SIDECAR = {"env": {"VLLM_GLM5N_SIDECAR_BLOCK_SIZE": "256"}}
# Seed 003's engine reserved vLLM's default indexer logits sentinel (its profile halves it to start PP8 on the pin)
# and served 1M requests on every layout (the PP8 profile ships a shorter context).
_SEED003 = {"env": {"VLLM_SPARSE_INDEXER_MAX_LOGITS_MB": "512"}, "vllm": {"max-model-len": 1_048_576}}


@dataclass(frozen=True)
class Case:
    label: str
    profile: str
    changes: dict[str, Any]
    published: int
    approximate: bool = False  # the seed says "about"
    # "own" / "sidecar": the seed's engine held the drafter's KV apart from the pool, or as sidecar ids in it, so
    # the comparable plan does too (the pin's own figure, drafter KV grouped by vLLM 0.34.0, is shown beside it).
    drafter_kv: DrafterKv = "pool"
    compared: str = ""  # what the published figure is, when it is not the seed's logged pool
    shipped: bool = False  # the case is the configuration a shipped profile serves: the row shows that profile's plan


def _seed(partition: tuple[int, ...], *more: dict[str, Any]) -> dict[str, Any]:
    """A seed's own layout (its profile may ship the search's) with the case's other changes."""
    changes: dict[str, Any] = {"parallel": {"partition": list(partition)}}
    for part in more:
        changes = merge(changes, part)
    return changes


CASES = (
    Case("seed 003 PP8, 0.96", "glm53-cmp170hx-pp8", _seed((11, 10, 10, 10, 10, 10, 9, 8), _SEED003), 1_025_573,
         drafter_kv="own", shipped=True),
    Case("seed 003 PP9, 0.93", "glm53-cmp170hx-pp9", _seed((10, 9, 9, 9, 9, 9, 9, 8, 6), _SEED003), 1_600_895,
         drafter_kv="own", shipped=True),
    Case("seed 003 PP10, 0.93", "glm53-cmp170hx-pp10", _seed((10, 8, 8, 8, 8, 8, 8, 8, 8, 4), _SEED003), 2_090_000,
         approximate=True, drafter_kv="own", shipped=True),
    Case("seed 002 8 cards NVFP4", "cmp170hx-8x-pp8", _seed((7, 5, 7, 5, 7, 5, 7, 2), _SIDECAR), 6_620_000,
         drafter_kv="sidecar", compared="core and sidecar ids", shipped=True),
    Case("seed 002 6 cards AWQ, prefix caching", "cmp170hx-6x-pp6", _seed((9, 7, 9, 7, 9, 4), _SIDECAR, {
        "vllm": {"enable-prefix-caching": True}}), 3_200_000, approximate=True, drafter_kv="sidecar",
         compared="core and sidecar ids", shipped=True),
    Case("seed 001 FP8 weights, bf16 KV", "l40-8x-tp8", _L40_BASE, 294_677),
    Case("seed 001 + FP8 KV", "l40-8x-tp8", merge(_L40_BASE, {"vllm": {"kv-cache-dtype": "fp8"}}), 561_895),
    Case("seed 001 + MTP k=3", "l40-8x-tp8", merge(_L40_BASE, {"vllm": _MTP}), 310_490),
    Case("seed 001 + FP8 linear attention", "l40-8x-tp8", merge(_L40_BASE, {
        "vllm": _MTP, "planner": {"bits": {"linear_attention": 8}}}), 382_472),
    Case("seed 001 + 4-bit experts", "l40-8x-tp8", merge(_L40_BASE, {
        "vllm": _MTP, "planner": {"bits": {"linear_attention": 8, "routed_experts": _EXL3_BITS}}}), 2_847_055,
         shipped=True),
    # SGLang's pool was capped by --max-total-tokens. The owner served NextN speculative decoding (3.20 GB of NextN
    # weights a rank) at --context-length 524,288; the seed does not give the draft depth: 3, an assumption.
    Case("seed 004 TP2 replica, NextN", "rtxpro6000-tp2-replicas", {"vllm": {
        "speculative-config": {"method": "mtp", "num_speculative_tokens": 3}, "max-model-len": 524_288}}, 500_000,
         compared="SGLang's --max-total-tokens", shipped=True),
)


def case_profile(case: Case) -> Profile:
    return Profile.model_validate(merge(load_profile(case.profile).model_dump(), case.changes))


def case_plan(case: Case, reserve: Reserve = RESERVE, drafter_kv: DrafterKv | None = None) -> Plan:
    return plan(Request(case_profile(case), drafter_kv=drafter_kv or case.drafter_kv), reserve)


def table(reserve: Reserve = RESERVE) -> list[dict[str, Any]]:
    """Each case planned as its seed's engine held the drafter's KV, and, for the cases a shipped profile serves,
    that profile as rigstack runs it on the pin (vLLM 0.34.0 with the stack: drafter KV grouped by vLLM), with both
    in usable sessions, their ratio (one planner on both sides, so its error mostly cancels) and what the profile
    changes from the owner's configuration."""
    rows = []
    for case in CASES:
        result = case_plan(case, reserve)
        pin = plan(Request(load_profile(case.profile)), reserve) if case.shipped else None
        owner, ours = _sessions(result), _sessions(pin) if pin else None
        rows.append({"case": case.label, "profile": case.profile, "published": case.published,
                     "approximate": case.approximate, "planned": result.pool_tokens,
                     "ratio": result.pool_tokens / case.published, "binding_stage": result.binding_stage,
                     "starts": result.starts, "drafter_kv": case.drafter_kv,
                     "compared": case.compared, "owner": owner, "pin": ours,
                     "pin_tokens": pin.pool_tokens if pin else None,
                     "pin_ratio": pin.pool_tokens / case.published if pin else None,
                     "like_for_like": pin.pool_tokens / result.pool_tokens if pin else None,
                     "like_for_like_sessions": ours["admitted"] / owner["admitted"] if ours else None,
                     "pin_verdict": judge(pin).value if pin else None,
                     "pin_partition": pin.partition if pin else None,
                     "changes": changes(case) if pin else None})
    return rows


def _sessions(result: Plan) -> dict[str, Any]:
    """What the pool is worth: max-model-len requests it holds (with the error bar's share) and how many of them
    max-num-seqs lets run at once."""
    held = usable(result)
    return {"held": held.sessions, "bar": held.sessions * error_bar_tokens(result) / result.pool_tokens,
            "admitted": held.admitted, "max_model_len": result.max_model_len}


def changes(case: Case) -> list[str]:
    """Where the shipped profile departs from the owner's configuration the case plans: each differing setting as
    "name owner -> rigstack", the checkpoint's figures as one item, and where the drafter's KV is held."""
    owner, ours = leaves(case_profile(case).model_dump()), leaves(load_profile(case.profile).model_dump())
    found, checkpoint = [], False
    for path in sorted(set(owner) | set(ours), key=lambda keys: ".".join(map(str, keys))):
        if owner.get(path) == ours.get(path):
            continue
        if path[0] == "model" or path[:2] == ("planner", "bits"):
            checkpoint = True
            continue
        found.append(f"{'.'.join(map(str, path[1:]))} {_shown(owner.get(path))} -> {_shown(ours.get(path))}")
    if checkpoint:
        found.append("checkpoint (size and bits)")
    if case.drafter_kv != "pool":
        found.append(f"drafter KV {case.drafter_kv} -> grouped by vLLM (0016/0017)")
    return found


def _shown(value: Any) -> str:
    if value is None:
        return "unset"
    if isinstance(value, (list, tuple)):
        return ",".join(map(str, value))
    if isinstance(value, int) and not isinstance(value, bool):
        return f"{value:,}"
    return str(value)
