"""What a pool is worth to requests (issue 38 item 5): pool tokens are not capacity.

vLLM's get_kv_cache_capacity says how many max-model-len requests the pool's blocks hold (Plan.sessions), but at
most max-num-seqs run at once; with prefix caching off no other request's blocks are ever allocated, so the rest of
the pool is KV memory no request can reach. With prefix caching on, finished requests' blocks stay cached there and
the whole pool is reachable.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from rigstack.planner.core import Plan


@dataclass(frozen=True)
class Usable:
    sessions: float  # max-model-len requests the pool holds
    admitted: float  # of those, how many max-num-seqs lets run at once
    unreachable_gib: float  # a card on the binding stage: pool no admitted request can reach (prefix caching off)
    unreachable_tokens: int  # the same share of the pool's tokens
    advice: str | None  # the setting that would use the pool, when some of it is unreachable


def usable(plan: Plan) -> Usable:
    sessions, seqs = plan.sessions, plan.max_num_seqs
    admitted = min(sessions, seqs)
    if plan.prefix_caching or sessions <= seqs:
        return Usable(sessions, admitted, 0.0, 0, None)
    stage = plan.stages[plan.binding_stage]
    share = 1 - seqs / sessions
    unreachable = stage.pool_gib * share
    levers = [f"max-num-seqs {math.floor(sessions)}", "prefix caching on (cached prefixes then fill the rest)"]
    if plan.util is not None and plan.memory_gib:
        smaller = math.floor((plan.util - unreachable / plan.memory_gib) * 100) / 100
        levers.append(f"gpu-memory-utilization {smaller:g} (the card's memory back for something else)")
    return Usable(sessions, admitted, unreachable, int(plan.pool_tokens * share), ", or ".join(levers))
