"""Whether a plan starts, judged against the planner's own error (issue 38 item 2).

vLLM refuses to start when a stage cannot hold one max-model-len request beside its pool's null block. A plan's
margin is the room the tightest stage has over that, in GiB a card. The planner misses real pools by about
ERROR_BAR_GIB a card (planner.heldout: the root mean square of the held-out errors over the owners' measured
pools), so a margin inside that is a coin toss, not a start:

- `refused`: the startup check fails, or a check of the planner's own does (host RAM for offloaded experts, no
  valid attention backend among those it can check);
- `marginal`: the check passes by less than the error bar; the verdict says how much to free and which setting frees
  it;
- `starts`: the margin is larger than the error bar.

What decides the boot but cannot be checked here (an attention backend whose code is not importable in this
interpreter) is listed as `unchecked`, with what checks it on the rig. CPU profiles have no error bar: their pools
equal the twin's logged pools exactly (tests/test_planner.py), and the fit is of GPU memory.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Literal

from rigstack.planner.core import Plan

# planner.heldout.fit().error_bar_gib, kept here because the fit plans every published case (minutes);
# tests/test_planner_heldout.py recomputes it and fails when it moves.
ERROR_BAR_GIB = 2.11
# Where the rig checks what the planner could not: preflight's kv-room runs this same plan on the rig, in the
# serving interpreter that has the rig's attention backends installed.
ON_THE_RIG = "preflight's kv-room check plans again on the rig, where vLLM's selector can import it"


@dataclass(frozen=True)
class Verdict:
    value: Literal["starts", "marginal", "refused"]
    stage: int | None  # the stage the verdict is about (the tightest margin, or the refused one)
    margin_gib: float  # that stage's room over one max-model-len request, GiB a card (negative: short)
    error_bar_gib: float
    why: str  # refused: the failing check; marginal: what to free and how; starts: the margin against the bar
    unchecked: list[str] = field(default_factory=list)  # "NAME: why not checkable here; what checks it"


def error_bar_gib(plan: Plan) -> float:
    return 0.0 if plan.util is None else ERROR_BAR_GIB


def error_bar_tokens(plan: Plan) -> float:
    """The error bar in pool tokens: its GiB a card on the binding stage, at that stage's bytes a token."""
    stage = plan.stages[plan.binding_stage]
    if not stage.bytes_per_block:
        return 0.0
    return error_bar_gib(plan) * 2**30 * plan.block_size / stage.bytes_per_block


def judge(plan: Plan, longest: int | None = None) -> Verdict:
    """The plan's verdict; `longest` (planner.search.longest_start, where the caller paid for it) is the longest
    max-model-len that starts, named as a lever when the plan is marginal or short."""
    bar = error_bar_gib(plan)
    margins = [stage.margin_gib for stage in plan.stages]
    tight = min(range(len(margins)), key=margins.__getitem__)
    unchecked, no_backend = _backend(plan)
    if not plan.starts or no_backend:
        stage = plan.refusal_stage if not plan.starts else None
        if no_backend or not plan.host_fits:
            why = no_backend or plan.refusal
        else:  # vLLM's own text is the plan's refusal, shown beside the verdict
            why = f"vLLM's startup check refuses on stage {stage}"
            why += f"; max-model-len {longest:,} starts (planned)" if longest else ""
        return Verdict("refused", stage, margins[tight], bar, why, unchecked)
    margin = margins[tight]
    if margin > bar:
        return Verdict("starts", tight, margin, bar, f"stage {tight} has {margin:.2f} GiB a card over one "
                       f"{plan.max_model_len:,}-token request, more than the planner's error bar ({bar:.2f})",
                       unchecked)
    return Verdict("marginal", tight, margin, bar, _levers(plan, tight, bar, longest), unchecked)


def _backend(plan: Plan) -> tuple[list[str], str | None]:
    """(the unchecked backends that could decide the boot, why no backend at all is valid or None)."""
    backend = plan.attention_backend
    if not backend:
        return [], None
    deciding = backend["outranked_by_unchecked"] if backend["picked"] else list(backend["unchecked"])
    unchecked = [f"{name} ({'; '.join(map(_short, backend['unchecked'][name]))}): {ON_THE_RIG}" for name in deciding]
    if backend["picked"] or unchecked:
        return unchecked, None
    if backend["forced"]:
        reasons = ", ".join(backend["invalid"].get(backend["forced"], ["not a backend vLLM's CUDA selector knows"]))
        return [], f"attention-backend {backend['forced']} is not valid for this rig ({reasons})"
    invalid = "; ".join(f"{name}: {', '.join(reasons)}" for name, reasons in backend["invalid"].items())
    return [], f"no valid attention backend for this rig (vLLM's CUDA selector: {invalid})"


def _short(reason: str) -> str:
    """An import error's text without the file it names (the planning interpreter's path says nothing of the rig)."""
    return re.sub(r" \(/[^)]*\)", "", reason)


def _levers(plan: Plan, index: int, bar: float, longest: int | None) -> str:
    """What frees the margin's shortfall against the bar on stage `index`: a shorter max-model-len (planned), a
    higher utilisation (the KV budget moves GiB for GiB with it), or (PP) fewer layers there."""
    stage = plan.stages[index]
    free_gib = bar - stage.margin_gib
    levers = [f"max-model-len {longest:,} (planned)"] if longest else []
    if plan.util is not None and plan.memory_gib:
        util = plan.util + free_gib / plan.memory_gib
        if util < 1:
            levers.append(f"gpu-memory-utilization {math.ceil(util * 100) / 100:g}")
    if plan.pp > 1:
        levers.append(f"fewer layers on stage {index} (`plan --search`)")
    how = ", or ".join(levers) if levers else "more cards"
    return (f"stage {index} has {stage.margin_gib:.2f} GiB a card over one {plan.max_model_len:,}-token request, "
            f"within the planner's error bar ({bar:.2f}): free {free_gib:.2f} GiB a card there: {how}")
