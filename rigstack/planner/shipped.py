"""Every shipped rig profile on the pin: `python -m rigstack plan-shipped` (serving interpreter) prints the
README's table of each GPU profile as shipped and what `rigstack plan --search` finds for its PP size (issue 27,
lever 5: a profile ships the best partition the search knows)."""

from __future__ import annotations

from typing import Any

from rigstack.planner.config import shape_known
from rigstack.planner.core import Request, plan
from rigstack.planner.usable import usable
from rigstack.planner.verdict import judge
from rigstack.profiles import list_profiles, load_profile, model_dir


def table() -> list[dict[str, Any]]:
    from rigstack.planner.search import search

    rows = []
    for name in list_profiles():
        profile = load_profile(name)
        # A profile whose model shape is not here (seed 004's Qwen engine: no config.json, no planner.config) has
        # nothing to plan from; kv-room skips it the same way.
        if profile.flavour != "gpu" or not shape_known(profile, model_dir(profile.model, build=False)):
            continue
        given = plan(Request(profile))
        found = search(Request(profile)) if given.pp > 1 else given
        verdict, use = judge(given), usable(given)
        rows.append({"profile": name, "seed": profile.seed, "pp": given.pp, "tp": given.tp,
                     "partition": given.partition, "pool_tokens": given.pool_tokens,
                     "verdict": verdict.value, "margin_gib": verdict.margin_gib,
                     "sessions": use.sessions, "admitted": use.admitted, "max_num_seqs": given.max_num_seqs,
                     "max_model_len": given.max_model_len, "unreachable_gib": use.unreachable_gib,
                     "binding_stage": given.binding_stage, "found_partition": found.partition,
                     "found_pool_tokens": found.pool_tokens, "found_verdict": judge(found).value})
    return rows
