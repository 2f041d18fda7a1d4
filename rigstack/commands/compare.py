"""compare.py A.json B.json: exit 2 when B regresses on A (a metric moved the wrong way by more than its tolerance,
or, for probe_bang results, the fidelity gate fails); exit 1 on an unreadable file. Add --debug for tracebacks."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from rigstack.output.probes import show_comparison
from rigstack.probes.compare import compare_files

app = typer.Typer(add_completion=False)


@app.command()
def main(a: Annotated[Path, typer.Argument(help="baseline result JSON")],
         b: Annotated[Path, typer.Argument(help="candidate result JSON")],
         tol: Annotated[list[str], typer.Option(help="relative tolerance: 0.05, or NAME=0.2 / '*.ttft_ms=0.3' per "
                                                     "metric (glob); repeat")] = []) -> int:
    comparison = compare_files(a, b, tol)
    show_comparison(comparison)
    return comparison.exit_code

