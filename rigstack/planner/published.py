"""The seeds' published KV pools against the planner: `python -m rigstack.planner.published [--fit]` (serving
interpreter) prints the README's table; --fit refits the reserve constants on the cases marked fit=True.

Each case is a profile plus the changes that make it the configuration the seed measured (deep-merged over the
profile, as `extends:` would).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, replace
from typing import Any

from rigstack.planner.core import RESERVE, Request, Reserve, plan
from rigstack.profiles import Profile, _merge, load_profile

# Seed 001's FP8 checkpoint: linear layers FP8 (block scales add 0.002 bits); vLLM keeps the KDA and MLA
# projections in BF16 (models/glm5next: "fp8 checkpoints omit their scales", "MLA projections are BF16").
_FP8 = {"routed_experts": 8, "shared_experts": 8, "dense_mlp": 8, "router": 16, "attention": 16,
        "linear_attention": 16}
# Its step 9 EXL3 experts: "Expert weights dropped from 39 GiB to 23 GiB per GPU", 8 x 23 / 39 bits.
_EXL3_BITS = 8 * 23 / 39
_L40_BASE = {"vllm": {"kv-cache-dtype": "auto", "speculative-config": None}, "planner": {"bits": _FP8}}


@dataclass(frozen=True)
class Case:
    label: str
    profile: str
    changes: dict[str, Any]
    published: int
    approximate: bool = False  # the seed says "about"
    fit: bool = False  # the reserve constants were fitted on this case


CASES = (
    Case("seed 003 PP8, 0.96", "glm53-cmp170hx-pp8", {}, 1_025_573, fit=True),
    Case("seed 003 PP9, 0.93", "glm53-cmp170hx-pp9", {}, 1_600_895),
    Case("seed 003 PP10, 0.93", "glm53-cmp170hx-pp10", {}, 2_090_000, approximate=True),
    Case("seed 002 8 cards NVFP4", "cmp170hx-8x-pp8", {}, 6_620_000),
    Case("seed 002 6 cards AWQ", "cmp170hx-6x-pp6", {}, 3_200_000, approximate=True),
    Case("seed 001 FP8 weights, bf16 KV", "l40-8x-tp8", _L40_BASE, 294_677),
    Case("seed 001 + FP8 KV", "l40-8x-tp8", _merge(_L40_BASE, {"vllm": {"kv-cache-dtype": "fp8"}}), 561_895),
    Case("seed 001 + MTP k=3", "l40-8x-tp8", _merge(_L40_BASE, {"vllm": {
        "kv-cache-dtype": "fp8", "speculative-config": {"method": "mtp", "num_speculative_tokens": 3}}}), 310_490),
    Case("seed 001 + FP8 linear attention", "l40-8x-tp8", _merge(_L40_BASE, {
        "vllm": {"kv-cache-dtype": "fp8", "speculative-config": {"method": "mtp", "num_speculative_tokens": 3}},
        "planner": {"bits": {"linear_attention": 8}}}), 382_472),
    Case("seed 001 + 4-bit experts", "l40-8x-tp8", _merge(_L40_BASE, {
        "vllm": {"kv-cache-dtype": "fp8", "speculative-config": {"method": "mtp", "num_speculative_tokens": 3}},
        "planner": {"bits": {"linear_attention": 8, "routed_experts": _EXL3_BITS}}}), 2_847_055),
)


def case_profile(case: Case) -> Profile:
    base = load_profile(case.profile).model_dump()
    return Profile.model_validate(_merge(base, case.changes))


def table(reserve: Reserve = RESERVE) -> list[dict[str, Any]]:
    rows = []
    for case in CASES:
        result = plan(Request(case_profile(case)), reserve)
        ratio = result.pool_tokens / case.published
        rows.append({"case": case.label, "published": case.published, "approximate": case.approximate,
                     "planned": result.pool_tokens, "ratio": ratio, "binding_stage": result.binding_stage,
                     "starts": result.starts, "fit": case.fit})
    return rows


def fit(low: float = -4.0, high: float = 8.0, steps: int = 16) -> Reserve:
    """fixed_gib by bisection so that the fit cases' mean ratio is 1 (the pool falls as the reserve grows)."""
    cases = [(case_profile(case), case) for case in CASES if case.fit]

    def mean_ratio(fixed: float) -> float:
        reserve = replace(RESERVE, fixed_gib=fixed)
        return sum(plan(Request(p), reserve).pool_tokens / c.published for p, c in cases) / len(cases)

    for _ in range(steps):
        middle = (low + high) / 2
        low, high = (middle, high) if mean_ratio(middle) > 1 else (low, middle)
    return replace(RESERVE, fixed_gib=round((low + high) / 2, 3))


def main(argv: list[str]) -> int:
    reserve = fit() if "--fit" in argv else RESERVE
    print(f"reserve: {reserve}")
    print("| case | published | planned | ratio | binding stage | vLLM starts |")
    print("|---|---:|---:|---:|---:|---|")
    for row in table(reserve):
        about = "about " if row["approximate"] else ""
        mark = " (fit)" if row["fit"] else ""
        print(f"| {row['case']}{mark} | {about}{row['published']:,} | {row['planned']:,} | {row['ratio']:.3f} | "
              f"{row['binding_stage']} | {'yes' if row['starts'] else 'no'} |")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
