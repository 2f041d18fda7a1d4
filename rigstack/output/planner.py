"""The plan for people: a per-stage table and a stacked-bar PNG (weights, reserve, KV, unused) per stage, or the
plan as JSON; and the seeds' published pools against the planner as the README's markdown table.

Works on the plan's JSON data, so it runs in the tool's own interpreter (matplotlib, no vLLM).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rigstack.atomic import replacing
from rigstack.errors import UserError
from rigstack.planner.core import Reserve

if TYPE_CHECKING:
    from rigstack.planner.heldout import Fit


def show_plan(plan: dict[str, Any], png: Path, as_json: bool) -> None:
    """The chart to png, then the plan (naming the chart) on stdout: as text, or as JSON with its "png" key."""
    plan = {**plan, "png": str(write_png(plan, png))}
    if as_json:
        print(json.dumps(plan, indent=1))
    else:
        print(text(plan))
        print(f"chart: {plan['png']}")


PUBLISHED_HEADER = ("| case | published | planned | ratio | binding stage | vLLM starts | "
                    "rigstack on the pin (the shipped profile) | sessions: owner's configuration / rigstack's | "
                    "rigstack / owner (one planner for both) | what rigstack's profile changes |")


def published_lines(rows: list[dict[str, Any]]) -> list[str]:
    """The README's published-pools table, one markdown line per row (tests/test_planner_published.py keeps the
    README's the same, cell by cell)."""
    lines = [PUBLISHED_HEADER, "|---|---:|---:|---:|---:|---|---|---|---:|---|"]
    for row in rows:
        about = "about " if row["approximate"] else ""
        what = f" ({row['compared']})" if row["compared"] else ""
        own = {"own": " (drafter KV apart)", "sidecar": " (drafter sidecar ids)"}.get(row["drafter_kv"], "")
        pin = sessions = like = changed = ""
        if row["pin_tokens"] is not None:
            pin = f"{row['profile']}: {row['pin_tokens']:,}, {row['pin_ratio']:.3f}, {row['pin_verdict']}"
            sessions = f"{_running(row['owner'])} / {_running(row['pin'])}"
            like = f"{row['like_for_like']:.2f}x pool, {row['like_for_like_sessions']:.2f}x sessions"
            changed = "; ".join(row["changes"]) or "nothing"
        lines.append(f"| {row['case']}{own} | {about}{row['published']:,}{what} | {row['planned']:,} | "
                     f"{row['ratio']:.3f} | {row['binding_stage']} | {'yes' if row['starts'] else 'no'} | {pin} | "
                     f"{sessions} | {like} | {changed} |")
    return lines


def _running(sessions: dict[str, Any]) -> str:
    """Max-model-len requests that can run at once; the pool's (with the error bar's share) where it holds more."""
    length = f"{sessions['max_model_len'] // 1024:,}k"
    if sessions["held"] > sessions["admitted"]:
        return f"{sessions['admitted']:.2f} of {length} (held {sessions['held']:.2f} ± {sessions['bar']:.2f})"
    return f"{sessions['held']:.2f} ± {sessions['bar']:.2f} of {length}"


def show_published(reserve: Reserve, rows: list[dict[str, Any]]) -> None:
    print(f"reserve: {reserve} (fitted on every measured case jointly: plan-published --held-out)")
    print("\n".join(published_lines(rows)))


HELD_OUT_HEADER = ("| case held out | published | planned (fit on the others) | fixed_gib of that fit | ratio | "
                   "GiB a card |")


def held_out_lines(fit: Fit) -> list[str]:
    """The held-out table (planner.heldout): each measured case planned with fixed_gib fitted on the others."""
    low, high = fit.ratio_spread
    lines = [f"fixed_gib on all {len(fit.held_out)} measured cases jointly: {fit.fixed_gib:.3f}; held out: ratio "
             f"{low:.3f} to {high:.3f}, root mean square {fit.error_bar_gib:.2f} GiB a card (the error bar)",
             HELD_OUT_HEADER, "|---|---:|---:|---:|---:|---:|"]
    lines += [f"| {h.case} | {h.published:,} | {h.planned:,} | {h.fixed_gib:.3f} | {h.ratio:.3f} | "
              f"{h.error_gib:+.2f} |" for h in fit.held_out]
    return lines


def show_held_out(fit: Fit) -> None:
    print("\n".join(held_out_lines(fit)))


SHIPPED_HEADER = ("| profile | seed | PP x TP | partition | pool on the pin | verdict (margin, GiB a card) | "
                  "max-model-len sessions: held / admitted | KV no request reaches, GiB a card | `--search` finds | "
                  "pool | verdict |")


def shipped_lines(rows: list[dict[str, Any]]) -> list[str]:
    """The README's table of the shipped GPU profiles on the pin (tests/test_planner_published.py keeps the
    README's the same, cell by cell); the search's columns read "the same" where it finds the shipped partition."""
    lines = [SHIPPED_HEADER, "|---|---|---|---|---:|---|---|---:|---|---:|---|"]
    for row in rows:
        same = row["found_partition"] == row["partition"]
        found = ("the same", "", "") if same else (",".join(map(str, row["found_partition"])),
                                                    f"{row['found_pool_tokens']:,}",
                                                    row["found_verdict"])
        lines.append(f"| {row['profile']} | {row['seed'] or ''} | PP{row['pp']} x TP{row['tp']} | "
                     f"{','.join(map(str, row['partition']))} | {row['pool_tokens']:,} | "
                     f"{row['verdict']} ({row['margin_gib']:+.2f}) | {_sessions(row)} | {row['unreachable_gib']:.2f} | "
                     f"{' | '.join(found)} |")
    return lines


def _sessions(row: dict[str, Any]) -> str:
    return (f"{row['sessions']:.2f} of {row['max_model_len'] // 1024:,}k / {row['admitted']:.2f} "
            f"(max-num-seqs {row['max_num_seqs']})")


def show_shipped(rows: list[dict[str, Any]]) -> None:
    print("\n".join(shipped_lines(rows)))


def _stage_lines(plan: dict[str, Any]) -> list[str]:
    """The per-stage table: weights + reserve + KV budget fill the card's budget; page, blocks and tokens are what
    the stage's budget alone holds; 1 request is vLLM's check's figure; pool is what the stage allocates."""
    budget = (f"{plan['memory_gib']:g} GiB x {plan['util']:g} = {plan['budget_gib']:.2f} GiB a card"
              if plan["util"] is not None else f"KV space {plan['budget_gib']:g} GiB a stage")
    lines = [f"budget {budget} = weights + reserve + KV budget; own: a sliding-window pool of its own (patch "
             "0016), off the KV budget; blocks and tokens: what the rest alone holds; 1 request: one max-model-len "
             f"request's KV there (vLLM's startup check); pool: the pool's {plan['pool_blocks']:,} blocks x the "
             "stage's page (what it allocates)",
             f"{'stage':>5} {'layers':>6} {'weights':>8} {'reserve':>8} {'KV budget':>9} {'own':>6} "
             f"{'page MiB':>9} {'blocks':>8} {'tokens':>12} {'1 request':>9} {'pool':>7}",
             f"{'':>5} {'':>6} {'GiB':>8} {'GiB':>8} {'GiB':>9} {'GiB':>6} {'':>9} {'alone':>8} {'alone':>12} "
             f"{'GiB':>9} {'GiB':>7}"]
    for stage in plan["stages"]:
        marks = []
        if stage["index"] == plan["binding_stage"] and plan["pp"] > 1:
            marks.append("fewest blocks: sets the pool")
        if not stage["holds_one"]:
            marks.append("cannot hold one request")
        lines.append(f"{stage['index']:>5} {stage['layers']:>6} {stage['weights_gib']:>8.2f} "
                     f"{stage['reserve_gib']:>8.2f} {stage['available_gib']:>9.2f} "
                     f"{stage.get('own_pool_gib', 0.0):>6.2f} "
                     f"{stage['bytes_per_block'] / 2**20:>9.2f} {stage['blocks']:>8,} {stage['tokens']:>12,} "
                     f"{stage['request_gib']:>9.2f} {stage['pool_gib']:>7.2f}"
                     + (f"  <- {'; '.join(marks)}" if marks else ""))
    return lines


def _stages_named(indices: list[int]) -> str:
    return ("stage " if len(indices) == 1 else "stages ") + ", ".join(map(str, indices))


def _error_bar(plan: dict[str, Any]) -> str:
    """The pool's error bar in tokens: the planner's GiB a card on the binding stage, at that stage's bytes a token."""
    tokens, gib = plan["error_bar_tokens"], plan["verdict"]["error_bar_gib"]
    return f" ± {tokens:,} (the planner's error bar, ± {gib:.2f} GiB a card)" if tokens else ""


def _verdict(plan: dict[str, Any]) -> str:
    if not plan.get("host_fits", True):
        return f"does not start: {plan['refusal']}"
    if plan["starts"]:
        return "vLLM's startup check (_check_enough_kv_cache_memory): passes on every stage"
    stage = plan.get("refusal_stage")
    others = [i for i in plan.get("short_stages", []) if i != stage]
    where = f" on stage {stage}" if stage is not None else ""
    also = f" ({_stages_named(others)} short too)" if others else ""
    return f"vLLM's startup check (_check_enough_kv_cache_memory): REFUSES{where}{also}: {plan['refusal']}"


def _search_line(plan: dict[str, Any]) -> str:
    found = plan["search"]
    given = found["given_partition"]
    if found.get("given_starts", True):
        verdict = "starts"
    else:
        short = found.get("given_short_stages") or []
        verdict = f"refused, {_stages_named(short)} short" if short else "refused"
    same = " (the given one)" if found["found_partition"] == given else ""
    return (f"search: {','.join(map(str, found['found_partition']))}{same} holds {found['found_pool_tokens']:,} "
            f"tokens (the plan above); the given {','.join(map(str, given))} {found['given_pool_tokens']:,} "
            f"({verdict})")


def text(plan: dict[str, Any]) -> str:
    lines = [f"{plan['profile']}: {plan['architecture']}, PP{plan['pp']} x TP{plan['tp']}, "
             f"partition {','.join(map(str, plan['partition']))}, KV {plan['kv_cache_dtype']}, "
             f"block {plan['block_size']:,} tokens, groups {', '.join(plan['groups'])}",
             f"weights: {plan['weights_source']}", *_stage_lines(plan),
             f"pool: {plan['pool_tokens']:,} tokens{_error_bar(plan)} ({plan['pool_blocks']:,} blocks, the fewest "
             f"any stage holds: stage {plan['binding_stage']}'s); {plan['sessions']:.2f} requests of "
             f"{plan['max_model_len']:,} tokens fit (target {plan['target_sessions']:g})"]
    if plan.get("host_gib"):
        have = plan.get("host_ram_gib")
        lines.append("host RAM, pinned for offloaded experts: "
                     + ", ".join(f"stage {stage['index']} {stage['host_gib']:.1f}" for stage in plan["stages"])
                     + f" GiB; {plan['host_gib']:.1f} GiB in all"
                     + (f" of the rig's {have:g}" if have is not None else " (no hardware.host_ram_gib to check)"))
    use = plan["usable"]
    if use["advice"]:
        lines.append(f"usable: {use['admitted']:.2f} of the {use['sessions']:.2f} requests the pool holds run at once "
                     f"(max-num-seqs {plan['max_num_seqs']}, prefix caching off): {use['unreachable_tokens']:,} "
                     f"tokens, {use['unreachable_gib']:.2f} GiB a card, no request reaches; use it with "
                     f"{use['advice']}")
    for other in plan.get("other_readings", []):
        lines.append(f"memory: the profile's other reading of a card, {other['memory_gib']:.2f} GiB, holds "
                     f"{other['pool_tokens']:,} tokens ({other['verdict']}); the plan above is at the smaller")
    lines.append(_verdict(plan))
    verdict = plan["verdict"]
    lines.append(f"verdict: {verdict['value']}: {verdict['why']}")
    lines += [f"unchecked: {item}" for item in verdict["unchecked"]]
    backend = plan.get("attention_backend")
    if backend:
        picked = backend["picked"] or "no valid attention backend among those checkable here"
        if backend.get("forced"):
            picked = f"{backend['forced']}, the profile's attention-backend" + ("" if backend["picked"] else
                                                                               ": not valid here")
        above = backend["outranked_by_unchecked"]
        lines.append(f"attention backend (vLLM's CUDA selector): {picked}"
                     + (f", unless one of {', '.join(above)} (ranked higher, not importable here) accepts" if above
                        else ""))
    if "search" in plan:
        lines.append(_search_line(plan))
    lines += [f"note: {note}" for note in plan["notes"]]
    return "\n".join(lines)


def check_chart_path(path: Path) -> None:
    """Before the plan is computed: a chart format matplotlib writes, and a file path rather than a folder."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    formats = FigureCanvasAgg.get_supported_filetypes()
    if path.is_dir():
        raise UserError(f"--png {path} is a folder; give the chart's file path (e.g. {path / 'plan.png'})")
    if path.suffix.lstrip(".").lower() not in formats:
        raise UserError(f"--png {path}: matplotlib writes no {path.suffix or 'suffix-less'} chart; end the name in "
                        f"one of {', '.join('.' + name for name in sorted(formats))}")


def write_png(plan: dict[str, Any], path: Path) -> Path:
    """One stacked bar per stage; written to a temporary file and moved into place."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    stages = plan["stages"]
    names = [f"{s['index']}\n({s['layers']} layers)" for s in stages]
    weights = [s["weights_gib"] for s in stages]
    reserve = [s["reserve_gib"] for s in stages]
    kv = [s["pool_gib"] for s in stages]
    unused = [max(0.0, s["available_gib"] - s["pool_gib"]) for s in stages]
    figure, axes = plt.subplots(figsize=(max(5, 1.1 * len(stages) + 2), 4.5))
    bottom = [0.0] * len(stages)
    for label, values in (("weights", weights), ("non-KV reserve", reserve), ("KV pool", kv),
                          ("KV budget unused (min over stages)", unused)):
        axes.bar(names, values, bottom=bottom, label=label)
        bottom = [b + v for b, v in zip(bottom, values)]
    if plan["util"] is not None:
        axes.axhline(plan["memory_gib"] * plan["util"], color="black", linestyle="--", linewidth=1,
                     label=f"{plan['memory_gib']:g} GiB x {plan['util']:g}")
    verdict = plan["verdict"]["value"]
    axes.set_title(f"{plan['profile']}: pool {plan['pool_tokens']:,} tokens, stage {plan['binding_stage']} binds, "
                   f"{verdict}", fontsize=9)
    axes.set_ylabel("GiB per card")
    axes.set_xlabel("pipeline stage")
    axes.legend(fontsize=7, loc="lower right")
    figure.tight_layout()
    try:
        with replacing(path) as scratch:
            figure.savefig(scratch, dpi=110)
    except OSError as error:
        raise UserError(f"cannot write the chart {path} ({error.strerror}); give --png a path you can write") \
            from None
    finally:
        plt.close(figure)
    return path
