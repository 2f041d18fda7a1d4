"""The plan for people: a per-stage table and a stacked-bar PNG (weights, reserve, KV, unused) per stage, or the
plan as JSON; and the seeds' published pools against the planner as the README's markdown table.

Works on the plan's JSON data, so it runs in the tool's own interpreter (matplotlib, no vLLM).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from rigstack.atomic import replacing
from rigstack.planner.core import Reserve


def show_plan(plan: dict[str, Any], png: Path, as_json: bool) -> None:
    """The chart to png, then the plan (naming the chart) on stdout: as text, or as JSON with its "png" key."""
    plan = {**plan, "png": str(write_png(plan, png))}
    if as_json:
        print(json.dumps(plan, indent=1))
    else:
        print(text(plan))
        print(f"chart: {plan['png']}")


def show_published(reserve: Reserve, util: float, rows: list[dict[str, Any]]) -> None:
    print(f"reserve: {reserve}; seed 001 utilisation {util}")
    print("| case | published | planned | ratio | binding stage | vLLM starts | the pin, drafter KV in the pool |")
    print("|---|---:|---:|---:|---:|---|---|")
    for row in rows:
        about = "about " if row["approximate"] else ""
        mark = f" (fit: {row['fit']})" if row["fit"] else ""
        what = f" ({row['compared']})" if row["compared"] else ""
        own = {"own": " (drafter KV apart)", "sidecar": " (drafter sidecar ids)"}.get(row["drafter_kv"], "")
        verdict = "starts" if row["pin_starts"] else "refused"
        pin = (f"{row['pin_tokens']:,}, stage {row['pin_binding_stage']}, {verdict}"
               if row["drafter_kv"] != "pool" else "the same")
        print(f"| {row['case']}{mark}{own} | {about}{row['published']:,}{what} | {row['planned']:,} | "
              f"{row['ratio']:.3f} | {row['binding_stage']} | {'yes' if row['starts'] else 'no'} | {pin} |")


def text(plan: dict[str, Any]) -> str:
    lines = [f"{plan['profile']}: {plan['architecture']}, PP{plan['pp']} x TP{plan['tp']}, "
             f"partition {','.join(map(str, plan['partition']))}, KV {plan['kv_cache_dtype']}, "
             f"block {plan['block_size']:,} tokens, groups {', '.join(plan['groups'])}",
             f"weights: {plan['weights_source']}"]
    budget = f"{plan['memory_gib']:g} GiB x {plan['util']:g}" if plan["util"] is not None else "KV space"
    lines.append(f"{'stage':>5} {'layers':>6} {'weights GiB':>11} {'reserve GiB':>11} {'KV GiB':>8} "
                 f"{'blocks':>8} {'tokens':>12}   (budget {budget})")
    for stage in plan["stages"]:
        mark = "  <- binds" if stage["index"] == plan["binding_stage"] and plan["pp"] > 1 else ""
        lines.append(f"{stage['index']:>5} {stage['layers']:>6} {stage['weights_gib']:>11.2f} "
                     f"{stage['reserve_gib']:>11.2f} {stage['kv_gib']:>8.2f} {stage['blocks']:>8,} "
                     f"{stage['tokens']:>12,}{mark}")
    lines.append(f"pool: {plan['pool_tokens']:,} tokens ({plan['pool_blocks']:,} blocks, the minimum over stages; "
                 f"stage {plan['binding_stage']} binds); {plan['sessions']:.2f} requests of "
                 f"{plan['max_model_len']:,} tokens fit (target {plan['target_sessions']:g})")
    if plan.get("host_gib"):
        have = plan.get("host_ram_gib")
        lines.append("host RAM, pinned for offloaded experts: "
                     + ", ".join(f"stage {stage['index']} {stage['host_gib']:.1f}" for stage in plan["stages"])
                     + f" GiB; {plan['host_gib']:.1f} GiB in all"
                     + (f" of the rig's {have:g}" if have is not None else " (no hardware.host_ram_gib to check)"))
    if not plan.get("host_fits", True):
        lines.append(f"does not start: {plan['refusal']}")
    elif plan["starts"]:
        lines.append("vLLM's startup check (_check_enough_kv_cache_memory): passes")
    else:
        lines.append(f"vLLM's startup check (_check_enough_kv_cache_memory): REFUSES: {plan['refusal']}")
    backend = plan.get("attention_backend")
    if backend:
        picked = backend["picked"] or "no valid attention backend among those checkable here"
        above = backend["outranked_by_unchecked"]
        lines.append(f"attention backend (vLLM's CUDA selector): {picked}"
                     + (f", unless one of {', '.join(above)} (ranked higher, not importable here) accepts" if above
                        else ""))
    if "search" in plan:
        found = plan["search"]
        lines.append(f"search: {','.join(map(str, found['found_partition']))} holds "
                     f"{found['found_pool_tokens']:,} tokens; the given {','.join(map(str, found['given_partition']))} "
                     f"{found['given_pool_tokens']:,}")
    lines += [f"note: {note}" for note in plan["notes"]]
    return "\n".join(lines)


def write_png(plan: dict[str, Any], path: Path) -> Path:
    """One stacked bar per stage; written to a temporary file and moved into place."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    stages = plan["stages"]
    names = [f"{s['index']}\n({s['layers']} layers)" for s in stages]
    weights = [s["weights_gib"] for s in stages]
    reserve = [s["reserve_gib"] for s in stages]
    kv = [s["kv_gib"] for s in stages]
    unused = [max(0.0, s["available_gib"] - s["kv_gib"]) for s in stages]
    figure, axes = plt.subplots(figsize=(max(5, 1.1 * len(stages) + 2), 4.5))
    bottom = [0.0] * len(stages)
    for label, values in (("weights", weights), ("non-KV reserve", reserve), ("KV pool", kv),
                          ("KV budget unused (min over stages)", unused)):
        axes.bar(names, values, bottom=bottom, label=label)
        bottom = [b + v for b, v in zip(bottom, values)]
    if plan["util"] is not None:
        axes.axhline(plan["memory_gib"] * plan["util"], color="black", linestyle="--", linewidth=1,
                     label=f"{plan['memory_gib']:g} GiB x {plan['util']:g}")
    verdict = "starts" if plan["starts"] else "vLLM refuses to start"
    axes.set_title(f"{plan['profile']}: pool {plan['pool_tokens']:,} tokens, stage {plan['binding_stage']} binds, "
                   f"{verdict}", fontsize=9)
    axes.set_ylabel("GiB per card")
    axes.set_xlabel("pipeline stage")
    axes.legend(fontsize=7, loc="lower right")
    figure.tight_layout()
    with replacing(path) as scratch:
        figure.savefig(scratch, dpi=110)
    plt.close(figure)
    return path
