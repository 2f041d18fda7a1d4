"""Compare two results of the same probe for CI gates: B regresses on A when a metric moves the wrong way by more
than its tolerance. Corruption-probe results are also put through the fidelity gate."""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass
from pathlib import Path

from rich.table import Table

from rigstack.cli import console
from rigstack.errors import UserError
from rigstack.probes import fidelity
from rigstack.probes.results import Metric, Result, load_result

EXIT_REGRESSION = 2
DEFAULT_TOL = 0.05


@dataclass(frozen=True)
class Tolerances:
    default: float
    patterns: tuple[tuple[str, float], ...]  # (glob over metric names, relative tolerance), last match wins

    def of(self, name: str) -> float:
        found = self.default
        for pattern, tol in self.patterns:
            if fnmatch.fnmatchcase(name, pattern):
                found = tol
        return found


def parse_tolerances(specs: list[str]) -> Tolerances:
    """"0.05" sets the default; "NAME=0.2" or "*.ttft_ms=0.3" sets it for matching metrics."""
    default, patterns = DEFAULT_TOL, []
    for spec in specs:
        name, sep, number = spec.rpartition("=")
        try:
            value = float(number)
        except ValueError:
            raise UserError(f"--tol {spec!r}: expected a number or NAME=NUMBER, like --tol 0.05 or "
                            "--tol '*.ttft_ms=0.3'") from None
        if value < 0:
            raise UserError(f"--tol {spec!r}: a tolerance is a fraction >= 0, like 0.05 for 5%")
        if sep:
            patterns.append((name, value))
        else:
            default = value
    return Tolerances(default, tuple(patterns))


def judge(a: Metric, b: Metric | None, tol: float) -> str | None:
    """Why B is a regression on A for one metric, or None."""
    if a.value is None:
        return None
    if b is None or b.value is None:
        return "missing in B"
    slack = tol * abs(a.value)
    if a.better == "equal":
        return None if b.value == a.value else "changed"
    if a.better == "higher" and b.value < a.value - slack:
        return f"fell {(a.value - b.value) / abs(a.value):.1%}" if a.value else "fell"
    if a.better == "lower" and b.value > a.value + slack:
        return f"rose {(b.value - a.value) / abs(a.value):.1%}" if a.value else "rose from 0"
    return None


def compare(a: Result, b: Result, tolerances: Tolerances) -> tuple[list[tuple[str, Metric, Metric | None, str]],
                                                                 fidelity.Fidelity | None]:
    if a.kind != b.kind:
        raise UserError(f"A is a {a.kind} result and B a {b.kind} result; compare results of the same probe")
    rows = []
    for name, metric in a.metrics.items():
        other = b.metrics.get(name)
        rows.append((name, metric, other, judge(metric, other, tolerances.of(name)) or ""))
    gate = fidelity.gate(a, b) if a.kind == "bang" and a.samples and b.samples else None
    return rows, gate


def _fmt(metric: Metric | None) -> str:
    if metric is None or metric.value is None:
        return "-"
    return f"{metric.value:.4g} {metric.unit}".strip()


def compare_files(path_a: Path, path_b: Path, tol_specs: list[str]) -> int:
    tolerances = parse_tolerances(tol_specs)
    a, b = load_result(path_a), load_result(path_b)
    rows, gate = compare(a, b, tolerances)
    table = Table(title=f"{a.kind}: A={path_a.name} B={path_b.name}")
    for column in ("metric", "A", "B", "tol", "verdict"):
        table.add_column(column)
    for name, metric, other, why in rows:
        table.add_row(name, _fmt(metric), _fmt(other), f"{tolerances.of(name):g}",
                      f"[red]REGRESSION: {why}[/]" if why else "ok")
    console.print(table)
    regressions = [f"{name} {why}" for name, _, _, why in rows if why]
    if gate is not None:
        console.print(gate.summary())
        if not gate.passed:
            regressions.append(f"fidelity: {gate.problems[0]}")
    if regressions:
        console.print(f"[bold red]{len(regressions)} regression(s):[/] {'; '.join(regressions[:3])}")
        return EXIT_REGRESSION
    console.print(f"no regression ({len(rows)} metrics)")
    return 0
