"""upstream-tests' table: per touched module the files, tests, passes on each package, skips and failures with
their commonest reasons, the verdict; then collection errors, regressions and the /dev/shm files removed."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

from rigstack.upstreamtests import Report

wide = Console(highlight=False, width=170)  # the table's eight columns need the width on CI's narrow log


def _reasons(counts: dict[str, int], shown: int = 3) -> str:
    """The commonest reasons, each cut short; the JSON keeps them all."""
    ranked = sorted(counts.items(), key=lambda item: -item[1])
    text = "; ".join(f"{count} {reason[:50]}" for reason, count in ranked[:shown])
    rest = sum(count for _, count in ranked[shown:])
    return text + (f"; {rest} other" if rest else "")


def show_upstream(report: Report) -> None:
    table = Table(title=f"vLLM's own tests ({report.sdist}): patched {report.patched} vs pristine {report.pristine}",
                  title_justify="left")
    for column in ("module", "files", "tests", "pass pristine", "pass patched", "skipped (why)",
                   "fail on both (why)", "verdict"):
        table.add_column(column, overflow="fold")
    for result in (*report.modules, report.total):
        verdict = ("[bold red]REGRESSED[/]" if result.regressions else
                   "[dim]no tests[/]" if not result.tests else "[green]as pristine[/]")
        table.add_row(result.module, str(len(result.files)), str(result.tests), str(result.passed_pristine),
                      str(result.passed_patched), _reasons(result.skipped), _reasons(result.failed_pristine),
                      verdict, end_section=result is report.modules[-1])
    wide.print(table)
    for line in report.total.collection_errors:
        wide.print(f"[yellow]collection error:[/] {line}")
    for line in report.total.regressions:
        wide.print(f"[red]regression:[/] {line}")
    if report.shm_removed:
        wide.print(f"removed {len(report.shm_removed)} /dev/shm file(s) upstream's tests created and left behind")
