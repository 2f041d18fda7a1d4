"""Probe output (on stderr: stdout stays free for pipes): a result's metrics and notes, compare's table and gate,
the swap's plan, boots and verdict."""

from __future__ import annotations

from rich.table import Table

from rigstack.cli import console
from rigstack.output.launch import LaunchView
from rigstack.probes import swap
from rigstack.probes.cli import Published
from rigstack.probes.compare import Comparison
from rigstack.probes.results import Metric


def _value(metric: Metric | None) -> str:
    if metric is None or metric.value is None:
        return "-"
    return f"{metric.value:.4g} {metric.unit}".strip()


def show_published(published: Published) -> None:
    shown = published.result
    table = Table(title=f"{shown.kind} @ {shown.provenance.url} ({shown.provenance.model})")
    table.add_column("metric")
    table.add_column("value", justify="right")
    for name, metric in shown.metrics.items():
        table.add_row(name, _value(metric))
    console.print(table)
    for note in shown.notes:  # server text may hold brackets: never read as markup
        console.print(f"note: {note}", markup=False)
    console.print("wrote " + ", ".join(str(path) for path in published.written), markup=False)


def show_comparison(comparison: Comparison) -> None:
    table = Table(title=f"{comparison.kind}: A={comparison.path_a.name} B={comparison.path_b.name}")
    for column in ("metric", "A", "B", "tol", "verdict"):
        table.add_column(column)
    for name, metric, other, why in comparison.rows:
        table.add_row(name, _value(metric), _value(other), f"{comparison.tolerances.of(name):g}",
                      f"[red]REGRESSION: {why}[/]" if why else "ok")
    console.print(table)
    if comparison.gate is not None:
        console.print(comparison.gate.summary())
    regressions = comparison.regressions
    if regressions:
        console.print(f"[bold red]{len(regressions)} regression(s):[/] {'; '.join(regressions[:3])}")
    else:
        console.print(f"no regression ({len(comparison.rows)} metrics)")


class SwapView(LaunchView):
    """The swap's on_event: its own events here, each boot's wait as the launcher shows it."""

    def __call__(self, event: swap.Event) -> None:
        match event:
            case swap.Planned(lines, dry_run):
                for line in lines:
                    console.print(line, markup=False)
                if dry_run:
                    console.print("dry run: nothing started")
            case Published():
                show_published(event)
            case swap.Verdict(text):
                console.print(f"verdict: {text}", markup=False)
            case _:
                super().__call__(event)
