"""verify's table: each check of an image's laid files against its manifest and the stack, and the verdict."""

from __future__ import annotations

from rich.table import Table

from rigstack.cli import console
from rigstack.images import VerifyReport


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
