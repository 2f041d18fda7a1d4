"""The patch-test proof: per patch, its tests on the patched package and on the stack below it, and the verdict."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

from rigstack.outcomekinds import BEHAVIOUR
from rigstack.patchtests import Proof

_VERDICT_STYLE = {BEHAVIOUR: "green", "NOT PROVEN": "bold red"}


def print_proof(proof: Proof, console: Console) -> None:
    table = Table(title=f"patch tests: patched {proof.patched} vs the stack below each patch on pristine "
                        f"{proof.pristine}", title_justify="left")
    for column in ("patch", "tests", "baseline", "pass patched", "fail baseline", "by behaviour", "could not run",
                   "guards", "skipped", "not run here", "verdict"):
        table.add_column(column)
    for patch in proof.patches:
        style = _VERDICT_STYLE.get(patch.verdict, "yellow")
        table.add_row(patch.patch_id, str(patch.tests), patch.baseline, f"{patch.patched_passed}/{patch.tests}",
                      f"{patch.baseline_failed}/{patch.tests - patch.guards}", str(patch.by_behaviour),
                      str(patch.could_not_run), str(patch.guards), str(patch.skipped), str(len(patch.not_run)),
                      f"[{style}]{patch.verdict}[/]")
    console.print(table)
    console.print("baseline: the pristine package with the patches below this one applied; by behaviour: there, the "
                  "test ran a function of a file the patch changes, then its own assertion failed or the package "
                  "raised; could not run: it failed there otherwise (a fixture, module, file, name, argument or key "
                  "the patch adds is missing, or it never reached the changed files)")
    for patch in proof.patches:
        for problem in patch.problems:
            console.print(f"[red]{patch.patch_id}:[/] {problem}")
    for patch in proof.patches:
        if patch.not_run:
            console.print(f"[yellow]{patch.patch_id}:[/] not proven here (deselected by -m '{proof.markers}': server "
                          "tests; CI runs them in the suite, on the patched package; --markers '' runs them here "
                          f"too): {', '.join(patch.not_run)}")
