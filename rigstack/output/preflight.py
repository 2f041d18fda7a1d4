"""Preflight's results, the profile catalogue and a profile's text, as a person or a machine reads them."""

from __future__ import annotations

import json

from rich.markup import escape
from rich.table import Table
from rich.text import Text

from rigstack import output
from rigstack.preflight.bench import TARGET_S, PreflightTiming
from rigstack.preflight.core import Result, Status
from rigstack.preflight.nvml import GpuScan
from rigstack.preflight.fleet import FleetReport
from rigstack.preflight.runner import PreflightReport
from rigstack.profiles import Profile

_STYLE = {Status.PASS: "green", Status.WARN: "yellow", Status.FAIL: "bold red", Status.SKIP: "dim"}


def print_report(report: PreflightReport, as_json: bool) -> None:
    if as_json:
        # indent, no key sorting: the order of checks is the order they ran.
        print(json.dumps(report.to_json(), indent=2))
        return
    _print_results(report.results)
    output.stdout.print(f"{report.profile.name}: {_counts(report.results)} ({report.seconds:.1f} s)", markup=False)


def _print_results(results: list[Result]) -> None:
    width = max(len(result.check) for result in results)
    for result in results:
        # Reasons quote profile values and paths: printed as text, never read as markup.
        output.stdout.print(Text.assemble((result.status.value, _STYLE[result.status]), f" {result.check:<{width}}  "
                                          f"{result.reason}"))
        if result.fix and result.status in (Status.FAIL, Status.WARN):
            output.stdout.print(f"     {'':<{width}}  fix: {result.fix}", markup=False)


def _counts(results: list[Result]) -> str:
    return ", ".join(f"{sum(r.status is s for r in results)} {s.value}" for s in Status)


def print_fits(gpus: GpuScan, rows: list[tuple[Profile, Result]], as_json: bool) -> None:
    if as_json:
        print(json.dumps([{"name": p.name, "gpus": p.gpus_needed, "fits": r.status is Status.PASS,
                           "reason": r.reason, "description": p.description} for p, r in rows], indent=2))
        return
    host_line = ", ".join(sorted({g.name for g in gpus.gpus})) or gpus.problem or "no GPU"
    table = Table(title=escape(f"profiles (this host: {len(gpus.gpus)} GPU(s): {host_line})"), title_justify="left")
    for column in ("profile", "GPUs", "fits", "description"):
        table.add_column(column)
    for profile, result in rows:
        fits = "[green]yes[/]" if result.status is Status.PASS else "[dim]no[/]"
        table.add_row(Text(profile.name), str(profile.gpus_needed), fits, Text(profile.description))
    output.stdout.print(table)


def print_text(text: str) -> None:
    output.stdout.print(text, markup=False, end="")


def show_timing(timing: PreflightTiming) -> None:
    """scripts/bench_preflight.py: the two settings side by side, then the headline against the target."""
    table = Table(title=f"python preflight.py {' '.join(timing.args)}  ({timing.runs} runs each)", title_justify="left")
    for column in ("setting", "first run s", "median wall s", "median CPU s", f"wall vs {TARGET_S:.1f} s target"):
        table.add_column(column, justify="right")
    for setting in timing.settings:
        table.add_row(setting.name, f"{setting.first_s:.2f}", f"{setting.wall_s:.2f}", f"{setting.cpu_s:.2f}",
                      f"{setting.wall_s / TARGET_S:.2f}x")
    output.stdout.print(table)
    verdict = "meets" if timing.headline_s < TARGET_S else "MISSES"
    output.stdout.print(f"median {timing.headline_s:.2f} s {verdict} the {TARGET_S:.1f} s target (preflight exit code "
                        f"{timing.exit_code}; {timing.cpus} CPUs, load average {timing.load:.1f})")


def print_fleet_report(report: FleetReport, as_json: bool) -> None:
    """Each member's checks under its name, then the fleet's own."""
    if as_json:
        print(json.dumps(report.to_json(), indent=2))
        return
    blocks = [(f"members.{index}: {profile.name} ({profile.model.served_name})", results)
              for index, (profile, results) in enumerate(report.members)]
    for title, results in [*blocks, (f"fleet {report.fleet.name}", report.results)]:
        output.stdout.print(Text(title, style="bold"))
        _print_results(results)
    everything = [result for _, results in report.members for result in results] + report.results
    output.stdout.print(f"fleet {report.fleet.name}: {_counts(everything)} ({report.seconds:.1f} s)", markup=False)
