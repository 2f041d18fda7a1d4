"""The patch-test proof: per patch, its tests on the patched and the pristine package, and the verdict."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

from rigstack.patchtests import Proof


def print_proof(proof: Proof, console: Console) -> None:
    table = Table(title=f"patch tests: patched {proof.patched} vs pristine {proof.pristine}", title_justify="left")
    for column in ("patch", "tests", "pass patched", "fail pristine", "guards", "skipped", "verdict"):
        table.add_column(column)
    for patch in proof.patches:
        verdict = "[green]proven[/]" if patch.ok else "[bold red]NOT PROVEN[/]"
        table.add_row(patch.patch_id, str(patch.tests), f"{patch.patched_passed}/{patch.tests}",
                      f"{patch.pristine_failed}/{patch.tests - patch.guards}", str(patch.guards), str(patch.skipped),
                      verdict)
    console.print(table)
    for patch in proof.patches:
        for problem in patch.problems:
            console.print(f"[red]{patch.patch_id}:[/] {problem}")
