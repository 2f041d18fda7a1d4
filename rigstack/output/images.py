"""Image output: a build's outcome, a local base made, verify's table of each laid file against its manifest."""

from __future__ import annotations

from rich.table import Table

from rigstack.cli import console
from rigstack.rigimages import BuildResult, VerifyReport
from rigstack.localbase import BaseImage


def show_report(report: VerifyReport) -> None:
    table = Table(title=f"verify-image {report.image}", show_lines=False)
    table.add_column("check")
    table.add_column("result")
    table.add_column("detail")
    for check in report.checks:
        if check.ok and check.name.startswith("vllm/") and report.ok and len(report.checks) > 12:
            continue  # a long all-good file list says nothing the summary line does not
        table.add_row(check.name, "[green]PASS[/]" if check.ok else "[bold red]FAIL[/]", check.detail)
    console.print(table)
    if report.ok:
        console.print(f"[green]PASS[/] {report.image}: every laid file matches its manifest and the stack")
    else:
        first = report.failures[0]
        console.print(f"[bold red]FAIL[/] {report.image}: {first.name}: {first.detail}")


def show_build(result: BuildResult) -> None:
    for warning in result.warnings:
        console.print(f"WARNING: {warning}", style="bold yellow", markup=False)
    for line in result.log:
        console.print(line, markup=False, highlight=False, style="dim")
    if result.built:
        console.print(f"{result.rig}: built {result.tag} ({result.image_id[7:19]}), {result.laid} file(s) laid over "
                      f"{result.base}", style="green", markup=False)
    else:
        console.print(f"{result.rig}: unchanged (cache key {result.cache_key[7:19]}), reusing "
                      f"{result.image_id[7:19]} as {result.tag}", markup=False)


def show_base(made: BaseImage) -> None:
    console.print(f"{made.tag}: {made.image_id[7:19]} ({made.how} in {made.seconds:.1f} s, key {made.key[7:19]})",
                  markup=False)
