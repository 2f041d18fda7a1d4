"""`import`'s table: each incoming patch, its new id and status, and the header fields a person must fill in."""

from __future__ import annotations

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from rigstack.importer import ImportResult

_STYLE = {"applied": "green", "offset": "yellow", "not-reached": "dim"}


def print_result(result: ImportResult, console: Console) -> None:
    title = f"import{' (dry run)' if result.dry_run else ''}: onto {result.base} -> {result.patches_dir}"
    table = Table(title=title, title_justify="left")
    for column in ("source", "new patch", "subject", "files", "status"):
        table.add_column(column)
    for row in result.patches:
        style = _STYLE.get(row.status, "bold red")
        status = f"[{style}]{row.status}[/]" + (f" ({escape(row.detail)})" if row.detail else "")
        table.add_row(escape(row.source), row.file or row.id, escape(row.subject), escape("\n".join(row.files)),
                      status)
    console.print(table)
    if not result.pinned:
        console.print(f"[yellow]note:[/] {result.base} is not the pinned vLLM baseline ({result.fingerprint[:19]}…); "
                      "the stack made here must be ported onto the pin")
    if result.written:
        console.print(f"wrote {len(result.written)} patch(es) into {result.patches_dir}")
    elif result.dry_run and not result.error:
        console.print("dry run: nothing was written")
    todo = [row for row in result.patches if row.unfilled]
    if todo and not result.error:
        table = Table(title="to do: fields a person must fill in (apply.py check warns until then)",
                      title_justify="left")
        table.add_column("patch")
        table.add_column("fields")
        for row in todo:
            table.add_row(row.file, ", ".join(row.unfilled))
        console.print(table)
