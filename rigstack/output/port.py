"""port's report: the stack's statuses on the new release, the new baseline, notes and what to do next."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

from rigstack.output.stack import print_stack_result
from rigstack.port import PortReport


_STYLE = {"clean": "green", "refreshed": "yellow", "moved": "cyan", "upstreamed": "blue", "dropped": "dim",
          "waiting": "magenta",
          "pending": "dim"}


def print_report(report: PortReport, console: Console) -> None:
    if report.old_stack:
        print_stack_result(report.old_stack, console)
    state = report.state
    if state is not None:
        table = Table(title=f"port: vLLM {state.old.version} -> {state.new.version} ({state.new.source})",
                      title_justify="left")
        # fold: at 80 columns a long file name is broken over lines, never cut to an ellipsis (issue 29 item 11)
        for column in ("patch", "status", "detail", "drift (functions changed upstream)"):
            table.add_column(column, overflow="fold")
        for entry in state.patches:
            style = _STYLE.get(entry.status, "bold red")
            table.add_row(entry.file, f"[{style}]{entry.status}[/]", entry.detail, "\n".join(entry.drift))
        console.print(table)
        console.print(f"new baseline: {state.new.wheel or state.new.source}  sha256 {state.new.sha256 or '-'}  "
                      f"fingerprint {state.new.fingerprint}")
        if state.cpu:
            console.print(f"CPU flavour: {state.cpu['status']}: {state.cpu['detail']}")
        for note in state.notes:
            console.print(f"[yellow]note:[/] {note}")
    for line in report.instructions:
        console.print(line)
    if report.message:
        console.print(report.message)
