"""expert-trace's report: per layer how concentrated the picks are and the hot sets' hit rates, then the totals and
the cost model's prediction, labelled as one."""

from __future__ import annotations

from rich.table import Table

from rigstack.cli import console
from rigstack.expert_trace import TOP_FRACTION, TraceReport


def show_trace(report: TraceReport) -> None:
    trace, hot_plan = report.trace, report.hot_plan
    if report.prompts_sent:
        console.print(f"sent {report.prompts_sent} prompts ({report.tokens_made} tokens generated)")
    table = Table("layer", "picks", f"hottest {TOP_FRACTION:.0%} take", "hit rate, own hot set",
                  "hit rate, summed hot set", title=f"{len(trace.counts)} MoE layers, {hot_plan.cache} hot experts "
                  f"a layer, {trace.expert_bytes / 2**20:.2f} MiB an expert")
    for layer in hot_plan.layers:
        table.add_row(layer.name, str(layer.picks), f"{layer.top_share:.1%}", f"{layer.hit_rate:.1%}",
                      f"{layer.summed_hit_rate:.1%}")
    console.print(table)
    console.print(f"hit rate over the trace: {hot_plan.hit_rate:.1%} with each layer's own hot set, "
                  f"{hot_plan.summed_hit_rate:.1%} with one set from the counts summed over layers")
    if report.predicted_tok_s is None:
        console.print("no decode prediction: give --top-k and --link-gb-s for the cost model")
        return
    own, summed = report.predicted_tok_s
    console.print(f"cost model (a prediction, not measured): {own:.2f} tok/s with the per-layer hot sets, "
                  f"{summed:.2f} with the summed set ({report.link_gb_s:g} GB/s link, {report.compute_ms:g} ms "
                  "compute a step)")
