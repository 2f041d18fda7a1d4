"""The seeds' published KV pools against the planner: `python -m rigstack.planner.published [--fit]` (serving
interpreter) prints the README's table; --fit refits the two constants on the cases marked fit (fixed_gib on seed
003 PP8, seed 001's utilisation on its first row); every other row is a prediction.

Each case is a profile plus the changes that make it the configuration the seed measured (deep-merged over the
profile, as `extends:` would).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, replace
from typing import Any

import typer

from rigstack.cli import run
from rigstack.errors import UserError
from rigstack.planner.core import RESERVE, DrafterKv, Plan, Request, Reserve, plan
from rigstack.profiles import Profile, _merge, load_profile

# Seed 001's FP8 checkpoint: linear layers FP8 (block scales add 0.002 bits); vLLM keeps the KDA and MLA
# projections in BF16 (models/glm5next: "fp8 checkpoints omit their scales", "MLA projections are BF16").
_FP8 = {"routed_experts": 8, "shared_experts": 8, "dense_mlp": 8, "router": 16, "attention": 16,
        "linear_attention": 16}
# Its step 9 EXL3 experts: "Expert weights dropped from 39 GiB to 23 GiB per GPU", 8 x 23 / 39 bits.
_EXL3_BITS = 8 * 23 / 39


# Seed 001 publishes no gpu-memory-utilization: fitted on its first row (--fit), the other four rows predicted.
_SEED001_UTIL = 0.958
_L40_BASE = {"vllm": {"kv-cache-dtype": "auto", "speculative-config": None, "gpu-memory-utilization": _SEED001_UTIL},
             "planner": {"bits": _FP8}}
_MTP = {"kv-cache-dtype": "fp8", "speculative-config": {"method": "mtp", "num_speculative_tokens": 3}}
# Seed 002's engine (its patch 0024) drew the drafter's sidecar ids from the pool at 256-token blocks; its logged
# pool (6.62M, "about 6.3 concurrent 1M requests") is vLLM's get_kv_cache_capacity over core and sidecar ids.
_SIDECAR = {"env": {"VLLM_GLM5N_SIDECAR_BLOCK_SIZE": "256"}}


@dataclass(frozen=True)
class Case:
    label: str
    profile: str
    changes: dict[str, Any]
    published: int
    approximate: bool = False  # the seed says "about"
    fit: str | None = None  # "reserve": fixed_gib fitted on this case; "util": _SEED001_UTIL fitted on it
    # "own" / "sidecar": the seed's engine held the drafter's KV apart from the pool, or as sidecar ids in it, so
    # the comparable plan does too (the pin's own figure, drafter KV grouped by vLLM 0.32.0, is shown beside it).
    drafter_kv: DrafterKv = "pool"
    compared: str = ""  # what the published figure is, when it is not the seed's logged pool


CASES = (
    Case("seed 003 PP8, 0.96", "glm53-cmp170hx-pp8", {}, 1_025_573, fit="reserve", drafter_kv="own"),
    Case("seed 003 PP9, 0.93", "glm53-cmp170hx-pp9", {}, 1_600_895, drafter_kv="own"),
    Case("seed 003 PP10, 0.93", "glm53-cmp170hx-pp10", {}, 2_090_000, approximate=True, drafter_kv="own"),
    Case("seed 002 8 cards NVFP4", "cmp170hx-8x-pp8", _SIDECAR, 6_620_000, drafter_kv="sidecar",
         compared="core and sidecar ids"),
    Case("seed 002 6 cards AWQ, prefix caching", "cmp170hx-6x-pp6", _merge(_SIDECAR, {
        "vllm": {"enable-prefix-caching": True}}), 3_200_000, approximate=True, drafter_kv="sidecar",
         compared="core and sidecar ids"),
    Case("seed 001 FP8 weights, bf16 KV", "l40-8x-tp8", _L40_BASE, 294_677, fit="util"),
    Case("seed 001 + FP8 KV", "l40-8x-tp8", _merge(_L40_BASE, {"vllm": {"kv-cache-dtype": "fp8"}}), 561_895),
    Case("seed 001 + MTP k=3", "l40-8x-tp8", _merge(_L40_BASE, {"vllm": _MTP}), 310_490),
    Case("seed 001 + FP8 linear attention", "l40-8x-tp8", _merge(_L40_BASE, {
        "vllm": _MTP, "planner": {"bits": {"linear_attention": 8}}}), 382_472),
    Case("seed 001 + 4-bit experts", "l40-8x-tp8", _merge(_L40_BASE, {
        "vllm": _MTP, "planner": {"bits": {"linear_attention": 8, "routed_experts": _EXL3_BITS}}}), 2_847_055),
)


def case_profile(case: Case, util: float | None = None) -> Profile:
    base = load_profile(case.profile).model_dump()
    changes = _merge(case.changes, {"vllm": {"gpu-memory-utilization": util}}) if util is not None else case.changes
    return Profile.model_validate(_merge(base, changes))


def case_plan(case: Case, reserve: Reserve = RESERVE, util: float | None = None,
              drafter_kv: DrafterKv | None = None) -> Plan:
    return plan(Request(case_profile(case, util), drafter_kv=drafter_kv or case.drafter_kv), reserve)


def table(reserve: Reserve = RESERVE, seed001_util: float = _SEED001_UTIL) -> list[dict[str, Any]]:
    rows = []
    for case in CASES:
        util = seed001_util if case.profile == "l40-8x-tp8" else None
        result = case_plan(case, reserve, util)
        pin = case_plan(case, reserve, util, "pool") if case.drafter_kv != "pool" else result
        rows.append({"case": case.label, "published": case.published, "approximate": case.approximate,
                     "planned": result.pool_tokens, "ratio": result.pool_tokens / case.published,
                     "binding_stage": result.binding_stage, "starts": result.starts, "fit": case.fit,
                     "drafter_kv": case.drafter_kv, "compared": case.compared, "pin_tokens": pin.pool_tokens,
                     "pin_binding_stage": pin.binding_stage, "pin_starts": pin.starts})
    return rows


def _bisect(ratio: Any, low: float, high: float, steps: int = 16) -> float:
    """The x in [low, high] where ratio(x) crosses 1, for a ratio that falls as x grows."""
    for _ in range(steps):
        middle = (low + high) / 2
        low, high = (middle, high) if ratio(middle) > 1 else (low, middle)
    return (low + high) / 2


def fit() -> tuple[Reserve, float]:
    """fixed_gib on the "reserve" case and seed 001's utilisation on the "util" case, each so that the planned
    pool equals the published one (each pool falls as its constant grows, or as the utilisation falls)."""
    by_kind = {case.fit: case for case in CASES if case.fit}
    reserve_case, util_case = by_kind["reserve"], by_kind["util"]
    fixed = _bisect(lambda x: case_plan(reserve_case, replace(RESERVE, fixed_gib=x)).pool_tokens
                    / reserve_case.published, -4.0, 8.0)
    reserve = replace(RESERVE, fixed_gib=round(fixed, 3))
    util = _bisect(lambda u: util_case.published / max(1, case_plan(util_case, reserve, u).pool_tokens), 0.5, 1.0)
    return reserve, round(util, 3)


app = typer.Typer(add_completion=False, pretty_exceptions_enable=False)


@app.command()
def main(refit: bool = typer.Option(False, "--fit", help="refit the two constants on their cases first")) -> None:
    """The seeds' published pools against the plan: the README's table, printed by rigstack/output/planner.py."""
    from rigstack.output.planner import show_published
    from rigstack.planner import has_vllm, serving_python

    if not has_vllm():  # core.plan builds the KV specs with vLLM's own classes
        raise UserError(f"the published pools are planned with vLLM's own code and {sys.executable} has no vllm; run "
                        f"`{serving_python() or 'the serving interpreter'} -m rigstack.planner.published`")
    reserve, util = fit() if refit else (RESERVE, _SEED001_UTIL)
    show_published(reserve, util, table(reserve, util))


if __name__ == "__main__":
    sys.exit(run(app))
