"""The planner's error from the owners' own pools, each predicted by a fit that never saw it (issue 38 item 1).

fixed_gib (core.Reserve: what a card holds beside its weights and the modelled workspaces: CUDA context, NCCL
buffers, the CUDA-graph pool) is the planner's one fitted constant. Here it is fitted on every published case that
logged a pool (seed 004's figure is a cap it set, not a pool, and is left out) jointly, and each case is planned
with the constant fitted on the others: that held-out error, in tokens and in GiB a card on the binding stage, is
what a plan of a rig nobody measured can be expected to miss by. Seed 001 published no utilisation: its cases are
planned at the default of the vLLM it ran (published.SEED001_ENGINE_UTIL), an assumption, never a fit. The joint
fit is the planner's shipped core.RESERVE, and the error bar is planner.verdict's ERROR_BAR_GIB (the test of this
module recomputes both).

The fit is in GiB a card: raising fixed_gib by d takes d GiB from every stage's KV budget, so a case's error in GiB
moves by -d (to a block's rounding), and the least-squares constant is the current one plus the mean error.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, replace

from rigstack.planner.core import GIB, RESERVE, Plan, Reserve
from rigstack.planner.published import CASES, Case, case_plan

@dataclass(frozen=True)
class HeldOut:
    case: str
    published: int
    planned: int  # with fixed_gib fitted on every other case
    fixed_gib: float  # that fit
    ratio: float  # planned / published
    error_gib: float  # (planned - published) tokens at the binding stage's bytes a token, per card


@dataclass(frozen=True)
class Fit:
    fixed_gib: float  # on every measured case
    held_out: tuple[HeldOut, ...]

    @property
    def error_bar_gib(self) -> float:
        """The root mean square of the held-out errors, GiB a card: the planner's error bar."""
        return math.sqrt(statistics.fmean(h.error_gib ** 2 for h in self.held_out))

    @property
    def ratio_spread(self) -> tuple[float, float]:
        return min(h.ratio for h in self.held_out), max(h.ratio for h in self.held_out)


def measured_cases() -> tuple[Case, ...]:
    """The cases whose published figure is a pool the owner's engine logged."""
    return tuple(case for case in CASES if "--max-total-tokens" not in case.compared)


def _plan(case: Case, fixed_gib: float) -> Plan:
    return case_plan(case, replace(RESERVE, fixed_gib=fixed_gib))


def error_gib(plan: Plan, published: int) -> float:
    """How far the plan's pool is from the published one, in GiB a card on the stage that sets the pool."""
    stage = plan.stages[plan.binding_stage]
    per_token = stage.bytes_per_block / plan.block_size
    return (plan.pool_tokens - published) * per_token / GIB


def fit(cases: tuple[Case, ...] | None = None, start: Reserve = RESERVE) -> Fit:
    """fixed_gib on all `cases` jointly, and each case held out in turn."""
    cases = cases or measured_cases()
    errors = {case.label: error_gib(_plan(case, start.fixed_gib), case.published) for case in cases}
    joint = start.fixed_gib + statistics.fmean(errors.values())
    held = []
    for case in cases:
        others = [errors[other.label] for other in cases if other is not case]
        fixed = round(start.fixed_gib + statistics.fmean(others), 3)
        plan = _plan(case, fixed)
        held.append(HeldOut(case.label, case.published, plan.pool_tokens, fixed, plan.pool_tokens / case.published,
                            error_gib(plan, case.published)))
    return Fit(round(joint, 3), tuple(held))
