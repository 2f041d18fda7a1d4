"""`apply.py import`: bring patches made elsewhere into the stack, and `export --format mbox` to send them back out.

Sources (one module each): git format-patch files and mboxes (mbox.py), a range of a git repository (gitrange.py),
quilt folders and plain diffs (quilt.py). Each patch is applied to a scratch copy of the baseline in git's object
store, after the stack already in patches/, and its diff is made again by git in the stack's form (full blob ids,
paths under a/vllm/, renames kept). Nothing is written to patches/ unless every patch applies, in order, with the
applier's own checks.
"""

from __future__ import annotations

import os
import re
import tempfile
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from rigstack import patchseries
from rigstack.baseline import (Fingerprint, Source, WheelSource, base_wheel, ignore_binaries, match_flavour,
                               parse_base, tracked_entries)
from rigstack.errors import UserError
from rigstack.gitrepo import PackageRepo
from rigstack.importer.checks import BASELINE_REF
from rigstack.importer.diffs import PathFilter, filtered
from rigstack.importer.gitrange import PREFIX, read_range
from rigstack.importer.incoming import Incoming, distinct_slugs
from rigstack.importer.mbox import export_mbox
from rigstack.importer.quilt import read_file, read_quilt
from rigstack.importer.series import ImportedPatch, ImportOptions, normalise_all
from rigstack.stack import DEFAULT_PATCHES_DIR, PACKAGE, Patch, load_stack
from rigstack.versions import Pins

__all__ = ["ImportOptions", "ImportResult", "ImportedPatch", "PathFilter", "export_mbox", "import_patches", "refused"]

_TAKEN = re.compile(r"^(\d{4})-")


@dataclass(frozen=True)
class ImportResult:
    base: str
    fingerprint: str
    pinned: bool  # whether the base is the pinned vLLM release
    patches_dir: str
    patches: tuple[ImportedPatch, ...]
    dry_run: bool
    written: tuple[str, ...] = ()
    error: str | None = None

    def to_json(self) -> dict:
        return asdict(self)


def import_patches(sources: list[str], pins: Pins, patches_dir: Path = DEFAULT_PATCHES_DIR, base: str = "wheel",
                   start: str | None = None, dry_run: bool = False, base_sha256: str | None = None,
                   options: ImportOptions = ImportOptions()) -> ImportResult:
    """Read every source, check each patch applies in order after the stack on `base`, and only then write them."""
    if not sources:
        raise UserError("name at least one SOURCE: patch files, an mbox, a quilt folder or git:PATH@A..B")
    stack = load_stack(patches_dir)
    first = _first_id(patches_dir, start)
    source = parse_base(base)
    with tempfile.TemporaryDirectory(prefix="rigstack-import-") as tmp:
        work = Path(tmp)
        git = PackageRepo(work / PACKAGE, git_dir=work / "git")
        git.init()
        incoming = distinct_slugs([_filtered(item, options.paths) for text in sources
                                   for item in _read_source(text, git, work, options.strip)])
        if first + len(incoming) > 10000:
            raise UserError(f"{len(incoming)} patches from id {first:04d} run past 9999; pass a lower --start")
        baseline, fingerprint = _baseline(git, source, pins, base_sha256)
        _, head, error = patchseries.commit_series(git, baseline, stack.patches)
        if error:
            raise UserError(f"the stack in {patches_dir} does not apply to {source.label}: {error}")
        rows, new, error = normalise_all(git, incoming, first, head, baseline, work / "staged", options,
                                         stack.patches)
        if error is None:
            checked, _, error = patchseries.commit_series(git, baseline, stack.patches + tuple(new))
            bad = {result.id: result for result in checked[len(stack.patches):]
                   if result.status not in patchseries.GOOD}
            rows = [replace(row, status=bad[row.id].status, detail=bad[row.id].detail) if row.id in bad else row
                    for row in rows]
            error = f"{error} (nothing was written)" if error else None
        written = () if error or dry_run else _write(new, patches_dir)
    return ImportResult(source.label, fingerprint, match_flavour(fingerprint, pins) is not None, str(patches_dir),
                        tuple(rows), dry_run, written, error)


def refused(error: UserError, base: str, patches_dir: Path, dry_run: bool) -> ImportResult:
    """The result of a run refused before any patch was tried (an unreadable source, a stack that does not apply),
    so that --json still prints one."""
    return ImportResult(base, "", False, str(patches_dir), (), dry_run, error=str(error))


def _filtered(item: Incoming, paths: PathFilter) -> Incoming:
    """The item with only the files --include/--exclude keep (none left: normalising it says so)."""
    diff, left_out = filtered(item.diff, item.strip, item.label, paths)
    return replace(item, diff=diff, left_out=tuple(left_out)) if left_out else item


def _read_source(text: str, git: PackageRepo, work: Path, strip: int | None) -> list[Incoming]:
    if text.startswith(PREFIX):
        return read_range(text, git, work)
    path = Path(text).expanduser()
    if path.is_dir() and not path.is_symlink():
        return read_quilt(path, git, work)
    if os.path.lexists(path):  # whatever it is: read_file says why a FIFO or a device is no patch
        return read_file(path, git, work, 1 if strip is None else strip)
    raise UserError(f"{text}: no such file or folder; a SOURCE is a patch file, an mbox, a quilt folder or "
                    "git:PATH@A..B")


def _first_id(patches_dir: Path, start: str | None) -> int:
    """After every id patches/ has taken, notes of upstreamed or dropped patches included (ids are never reused)."""
    taken = sorted((int(match.group(1)), path.name) for path in patches_dir.iterdir()
                   if (match := _TAKEN.match(path.name)))
    last, name = taken[-1] if taken else (0, "")
    if start is None:
        return last + 1
    if not re.fullmatch(r"\d{4}", start) or start == "0000":
        raise UserError(f"--start {start!r} is not a patch id; give four digits, e.g. --start {last + 1:04d}")
    if int(start) <= last:
        raise UserError(f"--start {start}: ids up to {last:04d} are taken ({name}); pick {last + 1:04d} or later")
    return int(start)


def _baseline(git: PackageRepo, source: Source, pins: Pins, sha256: str | None) -> tuple[str, str]:
    """(commit, fingerprint) of the base's text files in the scratch store."""
    if isinstance(source, WheelSource):  # wheels have one cached store each
        from rigstack.port.store import wheel_baseline  # one cached store of each wheel, shared with port

        return wheel_baseline(git, *base_wheel(source, pins, sha256), BASELINE_REF)
    if sha256:
        raise UserError("--base-sha256 checks a wheel; drop it for image: and dir: bases")
    if source.patched_by_rigstack():
        raise UserError(f"{source.label.partition(':')[2]} was patched by rigstack; --base needs a pristine package: "
                        "point it at one, or use --base wheel")
    files = source.files(pins, ignore_binaries)
    printer = Fingerprint()
    commit = git.import_commit(tracked_entries(files, printer), f"baseline: {source.label}\n", BASELINE_REF)
    return commit, printer.value


def _write(patches: list[Patch], folder: Path) -> tuple[str, ...]:
    """Every file first beside its place, then each renamed into it: a failed write leaves no partial patch."""
    partials = []
    try:
        for patch in patches:
            partial = folder / f".{patch.file}.tmp"
            partial.write_bytes(patch.path.read_bytes())
            partials.append((partial, folder / patch.file))
        for partial, target in partials:
            os.replace(partial, target)
    finally:
        for partial, _ in partials:
            partial.unlink(missing_ok=True)
    return tuple(str(target) for _, target in partials)
