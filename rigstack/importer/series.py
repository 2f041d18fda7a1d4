"""Each incoming patch in turn: checked, applied after the stack and the series' earlier patches in the scratch
store, and made again by git in the stack's form. Every patch gets a verdict in one run: a refusal or a failed
apply is recorded and the next patch is tried on what applied before it."""

from __future__ import annotations

import tempfile
from dataclasses import dataclass, field, replace
from pathlib import Path

from rigstack import patchseries
from rigstack.errors import UserError
from rigstack.gitrepo import PackageRepo
from rigstack.importer.checks import check_ids, check_parses, failure, refuse, rooted_at_parent
from rigstack.importer.diffs import PathFilter, files_of
from rigstack.importer.incoming import Incoming
from rigstack.stack import PACKAGE, SEPARATOR, Patch, parse_patch


@dataclass(frozen=True)
class ImportedPatch:
    source: str
    id: str
    file: str
    subject: str
    files: tuple[str, ...] = ()
    status: str = "not-reached"  # applied, offset (made exact on import), already-applied, fuzz, conflict, refused
    detail: str = ""
    unfilled: tuple[str, ...] = ()  # header fields a person still has to fill in
    clashes_with: str = ""  # the stack patch it does not apply over (it applies to the baseline without the stack)


@dataclass(frozen=True)
class ImportOptions:
    ignore_index: bool = False  # trust the context when index ids match no baseline (said in each patch's header)
    paths: PathFilter = field(default_factory=PathFilter)  # --include / --exclude
    strip: int | None = None  # -p for plain diffs (quilt lines and mails carry their own)


@dataclass
class _Heads:
    stack: str  # the baseline, the stack, and the series' patches so far
    series: str  # the baseline and the series' patches so far, without the stack (what the series was made on)
    patches: tuple[Patch, ...] = ()  # the stack's


def normalise_all(git: PackageRepo, incoming: list[Incoming], first: int, head: str, baseline: str, staged: Path,
                  options: ImportOptions, stack: tuple[Patch, ...] = ()) -> tuple[list[ImportedPatch], list[Patch],
                                                                             str | None]:
    """Every patch's verdict in order after `head` (the baseline with `stack` applied), the patch files of those
    that import, and the error when any does not (then nothing may be written)."""
    staged.mkdir()
    heads = _Heads(head, baseline, stack)
    rows, new, failed = [], [], []
    for position, item in enumerate(incoming):
        number = f"{first + position:04d}"
        try:
            row, patch = _normalise(git, item, number, heads, staged, options)
        except UserError as error:
            detail = str(error).removeprefix(f"{item.label} ({item.subject})").removeprefix(item.label)
            row, patch = ImportedPatch(item.label, number, "", item.subject, status="refused",
                                       detail=detail.removeprefix(": ").removeprefix(" ")), None
            failed.append(str(error))
        else:
            if patch is None:
                failed.append(f"{item.label} ({row.subject}): {row.detail}")
        rows.append(row)
        if patch is not None:
            new.append(patch)
    return rows, new, _summary(failed, rows)


def _summary(failed: list[str], rows: list[ImportedPatch]) -> str | None:
    if not failed:
        return None
    bad = [row for row in rows if row.status not in ("applied", "offset")]
    if bad[0].status == "already-applied":
        advice = "Leave it out"
    elif bad[0].clashes_with:  # made on the baseline, so --base would not help: the stack is in the way
        advice = (f"Remake it on top of the stack (a package `apply.py apply` patched), or fold its change into "
                  f"{bad[0].clashes_with}")
    else:
        advice = "Refresh it, or import it with --base set to the vLLM it was made on"
    if len(failed) == 1:
        return f"{failed[0]}; nothing was written. {advice}"
    return (f"{len(failed)} of the {len(rows)} patches do not import (each one's verdict is in the table); the "
            f"first: {failed[0]}; nothing was written. {advice}")


def _apply_onto(git: PackageRepo, raw: Path, head: str, strip: str, label: str) -> tuple[str | None, str, str]:
    """(commit, git's output, "") when the patch applies after `head`; (None, status, detail) when it does not."""
    with tempfile.TemporaryDirectory(prefix="rigstack-index-") as tmp:
        index = Path(tmp) / "index"
        git.read_tree_into(index, git.tree_of(head))
        forward = git.apply_to_index(raw, index, strip)
        if not forward.ok:
            return None, *failure(git, raw, index, strip, forward.output)
        return git.commit_tree(git.write_tree(index), head, f"import: {label}\n"), forward.output, ""


def _clash(git: PackageRepo, raw: Path, heads: _Heads, strip: str, label: str, paths: tuple[str, ...],
           row: ImportedPatch) -> ImportedPatch:
    """A patch that fails over the stack but applies without it collides with a stack patch: the last one that
    touches the file it fails in (else any file of it), named with that file."""
    if heads.series == heads.stack or _apply_onto(git, raw, heads.series, strip, label)[0] is None:
        return row
    failed = next((path for path in paths if f"{PACKAGE}/{path} " in f"{row.detail} "), None)
    for wanted in ([failed] if failed else []) + list(paths):
        patch = next((patch for patch in reversed(heads.patches) if wanted in patch.touched_files), None)
        if patch is not None:
            return replace(row, clashes_with=patch.file,
                           detail=f"{row.detail}: it collides with stack patch {patch.file} in {PACKAGE}/{wanted} "
                                  "(it applies to the baseline without the stack)")
    return row


def _normalise(git: PackageRepo, item: Incoming, number: str, heads: _Heads, staged: Path,
               options: ImportOptions) -> tuple[ImportedPatch, Patch | None]:
    """Apply one patch; on success its diff made again by git, in the stack's form, as a patch file."""
    files = files_of(item.diff, item.strip, item.label)
    if not files and item.left_out:
        raise UserError(f"{item.label} ({item.subject}): --include/--exclude leave none of its files "
                        f"({', '.join(item.left_out)}); leave it out, or widen the patterns")
    if not files:
        raise UserError(f"{item.label}: no file diff in it; is it a patch?")
    raw = staged / f".{number}.diff"
    raw.write_bytes(item.diff.encode())  # bytes: a CRLF file's CRs are its content
    check_parses(git, raw, item)
    fork = rooted_at_parent(git, item, files, heads.stack)
    package_path = (lambda path: path[len(PACKAGE) + 1:]) if fork else (lambda path: path)
    refuse(item, files, package_path)
    if not options.ignore_index:
        check_ids(git, item, files, (heads.stack, heads.series), package_path)
    row = ImportedPatch(item.label, number, "", item.subject)
    strip = f"-p{item.strip + fork}"
    commit, output, detail = _apply_onto(git, raw, heads.stack, strip, item.label)
    if commit is None:
        paths = tuple(package_path(entry.paths[-1]) for entry in files)
        row = replace(row, files=tuple(f"{PACKAGE}/{path}" for path in paths), status=output, detail=detail)
        return _clash(git, raw, heads, strip, item.label, paths, row), None
    heads.series = _apply_onto(git, raw, heads.series, strip, item.label)[0] or heads.series
    diff = git.diff(heads.stack, commit, renames=any(entry.rename for entry in files))
    if not diff:
        raise UserError(f"{item.label} ({item.subject}) changes nothing; leave it out")
    moved = patchseries.offsets(output, shown=1000)
    note = (f"imported with --ignore-index: its index lines match no blob of the baseline or the series, so its "
            f"context was trusted; {f'hunks moved: {moved}' if moved else 'every hunk applied at its line'}"
            if options.ignore_index else "")
    path = staged / f"{number}-{item.file_slug}.patch"
    path.write_bytes((item.header_text(note) + SEPARATOR + diff).encode())
    try:
        patch = parse_patch(path)
    except UserError as error:
        raise UserError(f"{item.label}: {str(error).removeprefix(f'{path}: ')}") from None
    heads.stack = commit
    touched = tuple(f"{entry.old} -> {entry.new}" if entry.rename else entry.paths[-1]
                    for entry in files_of(diff, 1, item.label))
    shown = f"hunks moved: {moved}; made exact on import" if moved else ""
    return (replace(row, file=patch.file, files=touched, status="offset" if moved else "applied",
                     unfilled=patch.header.unfilled(), detail=shown), patch)
