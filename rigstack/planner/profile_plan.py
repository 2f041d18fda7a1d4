"""The planner's question as the command line asks it: a profile name or path and its overrides, planned
(rigstack.planner.core) and, on request, searched for the partition with the larger pool (rigstack.planner.search).
What `python -m rigstack.planner` prints and rigstack.planner.plan_dict returns."""

from __future__ import annotations

from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

from rigstack.errors import UserError
from rigstack.planner.core import Request, plan
from rigstack.planner.search import longest_start, search
from rigstack.planner.usable import usable
from rigstack.planner.verdict import error_bar_tokens, judge
from rigstack.profiles import Profile, load_profile


def plan_for(profile: str, *, pp: int | None = None, tp: int | None = None, partition: str | list[int] | None = None,
             util: float | None = None, max_model_len: int | None = None, max_num_seqs: int | None = None,
             model: str | Path | None = None, kv_space_gib: float | None = None, memory_gib: float | None = None,
             search_partition: bool = False) -> dict[str, Any]:
    """plan() for a profile name or path, with the command line's overrides, as JSON-ready data; with
    search_partition, the searched partition's plan, with "search" comparing it to the given one."""
    if isinstance(partition, str):
        try:
            partition = [int(part) for part in partition.split(",")]
        except ValueError:
            raise UserError(f"--partition {partition!r}: give layer counts separated by commas, like 11,10,10") \
                from None
    request = Request(load_profile(profile), pp=pp, tp=tp, partition=tuple(partition) if partition else None,
                      util=util, max_model_len=max_model_len, max_num_seqs=max_num_seqs,
                      model=Path(model) if model else None, kv_space_gib=kv_space_gib, memory_gib=memory_gib)
    given = plan(request)
    verdict = judge(given)
    if not search_partition and (verdict.value == "marginal" or (not given.starts and given.host_fits)):
        verdict = judge(given, longest_start(request, given))  # a bisection of full plans: only where it is a lever
    result = given.to_json()
    if search_partition:
        found = search(request)
        result, verdict = found.to_json(), judge(found)
        result["search"] = {"given_partition": given.partition, "given_pool_tokens": given.pool_tokens,
                            "given_starts": given.starts, "given_refusal_stage": given.refusal_stage,
                            "given_short_stages": given.short_stages, "found_partition": found.partition,
                            "found_pool_tokens": found.pool_tokens}
    result["verdict"] = asdict(verdict)
    result["error_bar_tokens"] = round(error_bar_tokens(found if search_partition else given))
    # An owner's "64 GB" may be either reading: planned at the smaller (above), the others shown beside it.
    others = [] if memory_gib else sorted(request.profile.hardware.readings_gib)[1:]
    result["other_readings"] = [_reading(replace(request, memory_gib=gib)) for gib in others]
    result["usable"] = asdict(usable(found if search_partition else given))
    result["target_sessions"] = target_sessions(request.profile, result["max_num_seqs"])
    return result


def _reading(request: Request) -> dict[str, Any]:
    other = plan(request)
    return {"memory_gib": request.memory_gib, "pool_tokens": other.pool_tokens, "verdict": judge(other).value}


def target_sessions(profile: Profile, max_num_seqs: int) -> float:
    hints = profile.planner
    return hints.target_sessions if hints and hints.target_sessions else float(max_num_seqs)
