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
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path


from rigstack import applier
from rigstack.baseline import (Fingerprint, Source, WheelSource, base_wheel, ignore_binaries, match_flavour,
                               parse_base, tracked_entries)
from rigstack.errors import UserError
from rigstack.gitrepo import PackageRepo
from rigstack.importer.diffs import FileDiff, files_of
from rigstack.importer.gitrange import PREFIX, read_range
from rigstack.importer.incoming import Incoming
from rigstack.importer.mbox import export_mbox
from rigstack.importer.quilt import read_file, read_quilt
from rigstack.stack import DEFAULT_PATCHES_DIR, PACKAGE, SEPARATOR, Patch, load_stack, parse_patch
from rigstack.versions import Pins

__all__ = ["ImportResult", "ImportedPatch", "export_mbox", "import_patches"]

BASELINE_REF = "refs/import/baseline"
_TAKEN = re.compile(r"^(\d{4})-")


@dataclass(frozen=True)
class ImportedPatch:
    source: str
    id: str
    file: str
    subject: str
    files: tuple[str, ...] = ()
    status: str = "not-reached"  # applied, offset (made exact on import), already-applied, fuzz, conflict, ...
    detail: str = ""
    unfilled: tuple[str, ...] = ()  # header fields a person still has to fill in


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
                   start: str | None = None, dry_run: bool = False, base_sha256: str | None = None) -> ImportResult:
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
        incoming = [item for text in sources for item in _read_source(text, git, work)]
        if first + len(incoming) > 10000:
            raise UserError(f"{len(incoming)} patches from id {first:04d} run past 9999; pass a lower --start")
        baseline, fingerprint = _baseline(git, source, pins, base_sha256)
        _, head, error = applier.commit_series(git, baseline, stack.patches)
        if error:
            raise UserError(f"the stack in {patches_dir} does not apply to {source.label}: {error}")
        rows, new, error = _normalise_all(git, incoming, first, head, work / "staged")
        if error is None:
            checked, _, error = applier.commit_series(git, baseline, stack.patches + tuple(new))
            bad = {result.id: result for result in checked[len(stack.patches):] if result.status not in applier.GOOD}
            rows = [_replace(row, status=bad[row.id].status, detail=bad[row.id].detail) if row.id in bad else row
                    for row in rows]
            error = f"{error} (nothing was written)" if error else None
        written = () if error or dry_run else _write(new, patches_dir)
    return ImportResult(source.label, fingerprint, match_flavour(fingerprint, pins) is not None, str(patches_dir),
                        tuple(rows), dry_run, written, error)


def _normalise_all(git: PackageRepo, incoming: list[Incoming], first: int, head: str,
                   staged: Path) -> tuple[list[ImportedPatch], list[Patch], str | None]:
    """Each patch in order after `head`; the first that does not apply stops the rest (they are not reached)."""
    staged.mkdir()
    rows: list[ImportedPatch] = []
    new: list[Patch] = []
    for position, item in enumerate(incoming):
        row, head, patch = _normalise(git, item, f"{first + position:04d}", head, staged)
        rows.append(row)
        if patch is None:
            rows += [ImportedPatch(rest.label, f"{first + later:04d}", "", rest.subject)
                     for later, rest in enumerate(incoming[position + 1:], start=position + 1)]
            advice = "Leave it out" if row.status == "already-applied" else \
                "Refresh it, or import it with --base set to the vLLM it was made on"
            return rows, new, f"{item.label} ({row.subject}): {row.detail}; nothing was written. {advice}"
        new.append(patch)
    return rows, new, None


def _read_source(text: str, git: PackageRepo, work: Path) -> list[Incoming]:
    if text.startswith(PREFIX):
        return read_range(text, git, work)
    path = Path(text).expanduser()
    if path.is_dir():
        return read_quilt(path, git, work)
    if path.is_file():
        return read_file(path, git, work)
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
        from rigstack.port.store import _wheel_baseline  # one cached store of each wheel, shared with port

        return _wheel_baseline(git, *base_wheel(source, pins, sha256), BASELINE_REF)
    if sha256:
        raise UserError("--base-sha256 checks a wheel; drop it for image: and dir: bases")
    if source.patched_by_rigstack():
        raise UserError(f"{source.label.partition(':')[2]} was patched by rigstack; --base needs a pristine package: "
                        "point it at one, or use --base wheel")
    files = source.files(pins, ignore_binaries)
    printer = Fingerprint()
    commit = git.import_commit(tracked_entries(files, printer), f"baseline: {source.label}\n", BASELINE_REF)
    return commit, printer.value


def _normalise(git: PackageRepo, item: Incoming, number: str, head: str,
               staged: Path) -> tuple[ImportedPatch, str, Patch | None]:
    """Apply one patch after `head`; on success its diff made again by git, in the stack's form, as a patch file."""
    files = files_of(item.diff, item.strip, item.label)
    if not files:
        raise UserError(f"{item.label}: no file diff in it; is it a patch?")
    raw = staged / f".{number}.diff"
    raw.write_text(item.diff)
    _check_parses(git, raw, item)
    fork = _rooted_at_parent(git, item, files, head)
    package_path = (lambda path: path[len(PACKAGE) + 1:]) if fork else (lambda path: path)
    _refuse(item, files, package_path)
    _check_ids(git, item, files, head, package_path)
    row = ImportedPatch(item.label, number, "", item.subject)
    strip = f"-p{item.strip + fork}"
    with tempfile.TemporaryDirectory(prefix="rigstack-index-") as tmp:
        index = Path(tmp) / "index"
        git.read_tree_into(index, git.tree_of(head))
        forward = git.apply_to_index(raw, index, strip)
        if not forward.ok:
            status, detail = _failure(git, raw, index, strip, forward.output)
            return _replace(row, status=status, detail=detail), head, None
        commit = git.commit_tree(git.write_tree(index), head, f"import: {item.label}\n")
    diff = git.diff(head, commit, renames=any(entry.rename for entry in files))
    if not diff:
        raise UserError(f"{item.label} ({item.subject}) changes nothing; leave it out")
    path = staged / f"{number}-{item.file_slug}.patch"
    path.write_bytes((item.header_text() + SEPARATOR + diff).encode())
    try:
        patch = parse_patch(path)
    except UserError as error:
        raise UserError(f"{item.label}: {str(error).removeprefix(f'{path}: ')}") from None
    offset = "(offset" in forward.output
    touched = tuple(f"{entry.old} -> {entry.new}" if entry.rename else entry.paths[-1]
                    for entry in files_of(diff, 1, item.label))
    return (_replace(row, file=patch.file, files=touched,
                     status="offset" if offset else "applied", unfilled=patch.header.unfilled(),
                     detail="hunks moved: made exact on import" if offset else ""), commit, patch)


def _check_parses(git: PackageRepo, raw: Path, item: Incoming) -> None:
    """git's own reading of the patch (nothing applied): a damaged one is refused with git's words."""
    try:
        git.run("apply", "--numstat", f"-p{item.strip}", str(raw))
    except UserError as error:
        reason = str(error).partition(": ")[2].removeprefix("error: ")
        raise UserError(f"{item.label} ({item.subject}) is not a readable patch: {reason} of its diff; regenerate "
                        "it") from None


def _rooted_at_parent(git: PackageRepo, item: Incoming, files: list[FileDiff], head: str) -> bool:
    """Whether the paths start at the package's parent (vllm/x.py, a fork of vLLM) rather than in the package."""
    paths = [path for entry in files for path in entry.paths]
    inside = [path for path in paths if path.split("/")[0] == PACKAGE and path != PACKAGE]
    if item.layout == "fork" or (item.layout is None and inside):
        outside = next((path for path in paths if path not in inside), None)
        if outside:
            raise UserError(f"{item.label} ({item.subject}) touches {outside}, outside the {PACKAGE}/ package; "
                            f"patches may only change files under {PACKAGE}/: split it out of the patch")
        return True
    read = [entry.old for entry in files if entry.old]
    if item.layout is None and read and not any(_blob(git, head, path) for path in read):
        raise UserError(f"{item.label} ({item.subject}) changes {read[0]}, which is no file of the {PACKAGE} package "
                        f"(a patch for another package?); patches may only change files under {PACKAGE}/")
    return False


def _refuse(item: Incoming, files: list[FileDiff], package_path: Callable[[str], str]) -> None:
    """What the applier refuses, refused before anything is written."""
    for entry in files:
        name = f"{PACKAGE}/{package_path(entry.paths[0])}"
        if entry.binary:
            raise UserError(f"{item.label}: {name} is a binary patch; binary patches are refused")
        if entry.symlink:
            raise UserError(f"{item.label}: {name} is a symlink; symlinks are refused")
        for path in entry.paths:
            if path.startswith("/") or ".." in path.split("/"):
                raise UserError(f"{item.label}: {path!r} leaves the package; patches may only change files under "
                                f"{PACKAGE}/")


def _check_ids(git: PackageRepo, item: Incoming, files: list[FileDiff], head: str,
               package_path: Callable[[str], str]) -> None:
    """An index line's old blob id must be that file's blob on the baseline (a patch made on the pristine package)
    or after the patches before it (a series): otherwise the patch was made on another build."""
    for entry in files:
        if not entry.old or not entry.old_id or not entry.old_id.strip("0"):
            continue
        path = package_path(entry.old)
        blobs = [blob for commit in (BASELINE_REF, head) if (blob := _blob(git, commit, path))]
        if blobs and not any(blob.startswith(entry.old_id.lower()) for blob in blobs):
            raise UserError(f"{item.label} ({item.subject}): {PACKAGE}/{path} has index {entry.old_id}, but the "
                            f"baseline's blob of that file is {blobs[0][:12]}: the patch was made on another vLLM "
                            "build; import it with --base set to that build, then port it")


def _blob(git: PackageRepo, commit: str, path: str) -> str | None:
    listed = git.run("ls-tree", commit, "--", path).split()
    return listed[2] if len(listed) >= 3 and listed[1] == "blob" else None


def _failure(git: PackageRepo, raw: Path, index: Path, strip: str, output: str) -> tuple[str, str]:
    if git.apply_to_index(raw, index, strip, "--check", "-R").ok:
        return "already-applied", "its change is already in the baseline or the stack"
    failed, missing = applier.GIT_APPLY_FAILED_AT.search(output), applier.GIT_APPLY_MISSING.search(output)
    if missing:
        return "missing-file", f"{PACKAGE}/{missing.group(1)} does not exist in the baseline"
    where = f"{PACKAGE}/{failed.group(1)} at line {failed.group(2)}" if failed else "a hunk"
    if git.apply_to_index(raw, index, strip, "--check", "-C1").ok:
        return "fuzz", f"{where} applies only with fuzz"
    lines = [line for line in output.splitlines() if line.startswith("error:")]
    return "conflict", f"{where} does not apply" if failed or not lines else lines[0].removeprefix("error: ")


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


def _replace(row: ImportedPatch, **changes) -> ImportedPatch:  # noqa: ANN003
    return ImportedPatch(**{**asdict(row), **changes})
