"""Compare two results of the same probe for CI gates: B regresses on A when a metric moves the wrong way by more
than its tolerance. Corruption-probe results are also put through the fidelity gate."""

from __future__ import annotations

import fnmatch
import math
from dataclasses import dataclass
from pathlib import Path

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
        if not math.isfinite(value) or value < 0:  # nan would let any regression pass
            raise UserError(f"--tol {spec!r}: a tolerance is a finite fraction >= 0, like 0.05 for 5%")
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


@dataclass(frozen=True)
class Comparison:
    """Two result files side by side: per metric (name, A, B, why B regresses or ""), and the fidelity gate."""

    kind: str
    path_a: Path
    path_b: Path
    tolerances: Tolerances
    rows: list[tuple[str, Metric, Metric | None, str]]
    gate: fidelity.Fidelity | None

    @property
    def regressions(self) -> list[str]:
        found = [f"{name} {why}" for name, _, _, why in self.rows if why]
        if self.gate is not None and not self.gate.passed:
            found.append(f"fidelity: {self.gate.problems[0]}")
        return found

    @property
    def exit_code(self) -> int:
        return EXIT_REGRESSION if self.regressions else 0


def compare_files(path_a: Path, path_b: Path, tol_specs: list[str]) -> Comparison:
    tolerances = parse_tolerances(tol_specs)
    a, b = load_result(path_a), load_result(path_b)
    rows, gate = compare(a, b, tolerances)
    return Comparison(a.kind, path_a, path_b, tolerances, rows, gate)
