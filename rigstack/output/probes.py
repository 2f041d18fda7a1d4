"""Probe output (on stderr: stdout stays free for pipes): a result's metrics and notes, compare's table and gate,
the swap's plan, boots and verdict."""

from __future__ import annotations

import re

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
    title = f"{shown.kind} @ {shown.provenance.url} ({shown.provenance.model})"
    groups = _groups(list(shown.metrics))
    if groups is None:
        table = Table(title=title)
        table.add_column("metric")
        table.add_column("value", justify="right")
        for name, metric in shown.metrics.items():
            table.add_row(name, _value(metric))
    else:  # one row per workload (or level), its client and server figures side by side, as the seeds' tables
        names, columns = groups
        table = Table(title=title)
        table.add_column({"bench": "workload", "conc": "level"}.get(shown.kind, "group"))
        for column in columns:
            table.add_column(column, justify="right")
        for group in names:
            table.add_row(group, *(_value(shown.metrics.get(f"{group}.{column}")) if f"{group}.{column}" in
                                   shown.metrics else "" for column in columns))
    console.print(table)
    for note in _folded(shown.notes, groups[0] if groups else []):  # server text: never read as markup
        console.print(f"note: {note}", markup=False)
    console.print("wrote " + ", ".join(str(path) for path in published.written), markup=False)


def _groups(names: list[str]) -> tuple[list[str], list[str]] | None:
    """(groups, columns) when every metric is GROUP.NAME over two or more groups; None for a flat result."""
    split = [name.split(".", 1) for name in names]
    if not split or any(len(parts) != 2 for parts in split):
        return None
    groups = list(dict.fromkeys(group for group, _ in split))
    return (groups, list(dict.fromkeys(column for _, column in split))) if len(groups) > 1 else None


_NUMBER = re.compile(r"\d+(?:\.\d+)?(?:e[+-]?\d+)?")


def _folded(notes: list[str], groups: list[str]) -> list[str]:
    """One line per cause: "GROUP: text" notes that differ only in their figures are folded into one line naming
    every group (the figures stay in the result file); other notes as they are."""
    causes: dict[str, list[tuple[str, str]]] = {}
    lines: list[str | tuple[str]] = []
    for note in notes:
        group, sep, text = note.partition(": ")
        if not sep or group not in groups:
            lines.append(note)
            continue
        cause = _NUMBER.sub("N", text)
        if cause not in causes:
            causes[cause] = []
            lines.append((cause,))
        causes[cause].append((group, note))
    out = []
    for line in lines:
        if isinstance(line, str):
            out.append(line)
        elif len(causes[line[0]]) == 1:
            out.append(causes[line[0]][0][1])
        else:
            names = ", ".join(group for group, _ in causes[line[0]])
            out.append(f"{names}: {line[0]} (N: each one's figures, in the result file)")
    return out


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
