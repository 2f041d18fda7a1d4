"""apply's and status's results for a person: rich tables on stderr (their JSON goes to stdout instead)."""

from __future__ import annotations


from rich.console import Console
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from rigstack.applier import StackResult
from rigstack.invocation import command

_STYLE = {"applied": "green", "offset": "yellow", "already-applied": "cyan", "not-reached": "dim"}


def print_stack_result(result: StackResult, console: Console) -> None:
    title = f"{'check' if result.dry_run else 'apply'}: {result.source} -> {result.package}"
    table = Table(title=escape(title), title_justify="left")
    for column in ("patch", "status", "detail"):
        table.add_column(column)
    for patch in result.patches:
        style = _STYLE.get(patch.status, "bold red")
        table.add_row(Text(patch.file), Text(patch.status, style), Text(patch.detail))
    if result.patches:
        console.print(table)
    else:
        console.print(f"{title}: no patches selected", markup=False)
    console.print(f"baseline {result.flavour} {result.fingerprint[:19]}…  stack {result.stack_hash[:19]}…")
    for note in result.notes:
        console.print(Text.assemble(("note:", "yellow"), f" {note}"))
    if result.written and result.combined_diff:
        console.print(f"combined diff: {result.combined_diff}", markup=False)


def print_status(status: dict, console: Console) -> None:
    table = Table(title=escape(f"{status['package']} (vLLM {status['vllm_version']}, {status['flavour']})"),
                  title_justify="left")
    for column in ("patch", "status", "commit"):
        table.add_column(column)
    for patch in status["patches"]:
        table.add_row(Text(patch["file"]), Text(patch["status"]), patch["commit"][:12])
    console.print(table)
    console.print(f"stack {status['stack_hash']}  stamp matches history: {status['stamp_matches_history']}")
    if status["stamp_disagrees_on"]:
        console.print(Text.assemble(("note:", "yellow"), " the stamp disagrees with the git history "
                                    f"({status['stamp_disagrees_on']}), so the above is read from the history; "
                                    f"`{command('apply --from dir:' + str(status['package']))}` rewrites the stamp"))
    if status["compiled_changed"]:
        changed = ", ".join(f"{path} ({how})" for path, how in sorted(status["compiled_changed"].items()))
        console.print(Text.assemble(("compiled files not as built:", "yellow"),
                                    f" {changed}, against {status['compiled_checked_against']}"))
    if status["dirty_files"]:
        dirty = ", ".join(status["dirty_files"][:10])
        console.print(Text.assemble(("changed outside the stack:", "yellow"), f" {dirty}"))
