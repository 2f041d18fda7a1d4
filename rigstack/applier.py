"""Apply the stack to a vLLM package with git: a baseline commit, one commit per patch, a stamp, a combined diff.

Every patch is checked and committed in git's object store (against a scratch index, rigstack.patchseries) before
the work tree is touched, so a stack that fails leaves the package exactly as it was. Only then does one checkout
write the files the stack changes (rigstack.checkout); a journal makes that last step recoverable if it is
interrupted (rigstack.journal), and one lock per real package keeps two runs apart (rigstack.lock). A patched
package is read back by rigstack.patched.
"""

from __future__ import annotations

import errno
import os
import shutil
import tempfile
import zipfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path

from rigstack import __version__, compiled, history, journal
from rigstack.atomic import write_atomic
from rigstack.baseline import (BinaryWriter, Fingerprint, PackageFile, Source, first_difference,
                               ignore_binaries, match_flavour, tracked_entries)
from rigstack.cache import cache_dir
from rigstack.checkout import check_free, checkout
from rigstack.errors import UserError
from rigstack.gitrepo import PackageRepo, state_dir_for
from rigstack.history import version_of
from rigstack.invocation import command
from rigstack.journal import JOURNAL
from rigstack.lock import LOCK, target_lock
from rigstack.patchseries import PatchResult, commit_series
from rigstack.stack import Stack
from rigstack.stamp import STAMP_NAME, Stamp, StampedPatch
from rigstack.versions import FLAVOURS, Pins

COMBINED_DIFF = "all-changes-vs-baseline.diff"


@dataclass(frozen=True)
class StackResult:
    package: str
    source: str
    flavour: str
    fingerprint: str
    stack_hash: str
    patches: tuple[PatchResult, ...]
    notes: tuple[str, ...] = ()
    error: str | None = None
    written: bool = False
    dry_run: bool = False
    combined_diff: str | None = None
    tool_version: str = field(default=__version__)

    def to_json(self) -> dict:
        return asdict(self)


def apply_stack(source: Source, stack: Stack, pins: Pins, out: Path | None = None, dry_run: bool = False,
                notes: tuple[str, ...] = ()) -> StackResult:
    """Bring the package of `source` to exactly `stack` (idempotent); with dry_run, only report what would happen."""
    # The real path: through a symlink the state folder (git dir, journal, lock) would be another one.
    package = Path(os.path.realpath(source.package(pins, out)))
    state = state_dir_for(package)
    if dry_run and not state.exists():
        return _apply_locked(package, source, stack, pins, dry_run, notes)  # a fresh target: nothing to guard
    _refuse_unwritable(package, source)
    with target_lock(state, package), _disk_errors(package):
        return _apply_locked(package, source, stack, pins, dry_run, notes)


def _apply_locked(package: Path, source: Source, stack: Stack, pins: Pins, dry_run: bool,
                  notes: tuple[str, ...]) -> StackResult:
    repo = PackageRepo(package)
    if not dry_run:
        notes = notes + _remove_leftovers(repo, source)
    if repo.exists and _holds_history(repo):
        return _update(repo, source, stack, pins, dry_run, notes)
    if repo.exists and not dry_run:
        # A first apply killed before its checkout (which writes the index, then the journal) left only a baseline
        # commit beside the package; the package itself was never touched. Start over.
        _forget(repo)
        notes = notes + ("removed what an interrupted first apply had left beside the package",)
    if source.in_place:
        if not package.is_dir():
            raise UserError(f"{package} does not exist; point --from dir: at an extracted vllm package")
        try:
            result = _first_apply(repo, source, stack, pins, dry_run, notes, source.files(pins, ignore_binaries),
                                  binaries=None)
        except BaseException:
            if not dry_run:
                _forget(repo)
            raise
        if not result.written and not dry_run:
            _forget(repo)
        return result
    state = state_dir_for(package)
    if package.parent.exists() and any(path != state for path in package.parent.iterdir()):
        raise UserError(f"{package.parent} exists and was not made by rigstack; remove it or pass another --out")
    return _first_apply_extracted(package, source, stack, pins, dry_run, notes)


def _remove_leftovers(repo: PackageRepo, source: Source) -> tuple[str, ...]:
    """What killed runs left (under the lock, so no other run is using it): git's lock files, staging folders."""
    notes = []
    stale = repo.remove_stale_locks()
    if stale:
        notes.append(f"removed git's {', '.join(stale)} left by a killed run")
    for partial in journal.leftover_temporaries(repo.git_dir.parent):
        partial.unlink()
        notes.append(f"removed {partial.name}, a journal a killed run was still writing (its checkout never began)")
    if not source.in_place:
        out = repo.package.parent
        staged = sorted(out.parent.glob(f".{out.name}.tmp-*")) if out.parent.is_dir() else []
        for folder in staged:
            shutil.rmtree(folder, ignore_errors=True)
        if staged:
            notes.append(f"removed {len(staged)} staging folder(s) that interrupted applies had left in {out.parent}")
    return tuple(notes)


def _refuse_unwritable(package: Path, source: Source) -> None:
    """Name the read-only folder before any work: git's own failures there read like a patch problem."""
    state = state_dir_for(package)
    folder = state if state.exists() else next(path for path in (package.parent, *package.parents) if path.exists())
    needed = [folder] + ([package] if package.is_dir() else [])  # a wheel's package too, once laid
    for path in needed:
        if not os.access(path, os.W_OK):
            raise UserError(f"{path} is not writable; make it writable or "
                            f"{'copy the package somewhere writable' if source.in_place else 'pass another --out'}"
                            "; nothing was changed")


@contextmanager
def _disk_errors(package: Path) -> Iterator[None]:
    """A full disk or a read-only file system met mid-way is one clear line, not a traceback."""
    try:
        yield
    except OSError as error:
        if error.errno == errno.ENOSPC:
            raise UserError(f"no space left on the device of {package.parent} ({error.filename or 'writing'}); free "
                            "some space and rerun: the next run finishes or undoes this one") from None
        if error.errno in (errno.EROFS, errno.EACCES, errno.EPERM):
            raise UserError(f"{error.filename or package} is not writable ({error.strerror}); make it writable and "
                            "rerun") from None
        raise


def _first_apply_extracted(package: Path, source: Source, stack: Stack, pins: Pins, dry_run: bool,
                           notes: tuple[str, ...]) -> StackResult:
    """Wheel and image sources: build the whole tree in a scratch folder, then move it into place.

    The git dir moves first and the package last, in one rename: a run killed in between leaves history without a
    package, which the next run starts over from."""
    out = package.parent
    # A check writes nothing beside the target, so it stages in the temporary folder.
    staging = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=None if dry_run else out.parent))
    try:
        staged = staging / "vllm"
        binaries = None
        if not dry_run:
            staged.mkdir()
            _refuse_small_disk(out, source, pins)
            binaries = BinaryWriter(staged, _binary_cache(source, pins))
        files = source.files(pins, binaries or ignore_binaries)
        repo = PackageRepo(staged, git_dir=state_dir_for(staged) / "git")
        result = _first_apply(repo, source, stack, pins, dry_run, notes, files, binaries)
        if result.written:
            state = state_dir_for(package)
            for entry in sorted(state_dir_for(staged).iterdir(), key=lambda path: path.name != "git"):
                os.replace(entry, state / entry.name)
            os.replace(staged, package)
            result = _relocated(result, package)
        return result
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _refuse_small_disk(out: Path, source: Source, pins: Pins) -> None:
    """A wheel's sizes are in its index: refuse before writing when the package and its history cannot fit."""
    pinned = source.pinned_wheel(pins)
    if pinned is None:
        return
    wheel = pinned[0]
    if not wheel.is_file():
        return  # downloaded on the way; a full disk then is caught as ENOSPC
    try:
        with zipfile.ZipFile(wheel) as archive:
            files = [info for info in archive.infolist() if info.filename.startswith("vllm/")]
    except zipfile.BadZipFile:
        return  # the sha256 check that follows names the damaged file
    text = sum(info.file_size for info in files if not info.filename.endswith(".so"))
    # The package, plus the baseline pack (uncompressed text) and the index.
    needed = sum(info.file_size for info in files) + text + (8 << 20)
    check_free(out.parent, needed)


def _binary_cache(source: Source, pins: Pins) -> Path | None:
    pinned = source.pinned_wheel(pins)
    return cache_dir() / "extracted" / pinned[1] if pinned else None


def _first_apply(repo: PackageRepo, source: Source, stack: Stack, pins: Pins, dry_run: bool,
                 notes: tuple[str, ...], files: Iterator[PackageFile], binaries: BinaryWriter | None) -> StackResult:
    """Baseline commit from `files`, verified against the pinned fingerprint, then the stack on top.

    With `binaries` (wheel and image sources) the package folder is empty and git writes the patched tree itself,
    so the index gets its stat data for free; a directory source already holds the baseline files instead."""
    with _scratch_git(repo, dry_run) as work:
        work.init()
        work.run("config", "core.worktree", f"../../{repo.package.name}")
        printer = Fingerprint()
        untracked: list[str] = []
        with work.fast_import() as stream:
            stream.commit(tracked_entries(files, printer, untracked), f"baseline: {source.label}\n")
        work.exclude(untracked)
        flavour = _verify_baseline(printer, source, pins)
        baseline = work.rev("refs/heads/rigstack")
        assert baseline is not None
        work.run("symbolic-ref", "HEAD", "refs/heads/rigstack")
        results, final, error = commit_series(work, baseline, stack.patches)
        result = StackResult(str(repo.package), source.label, flavour, printer.value, stack.stack_hash,
                             tuple(results), notes, error, written=False, dry_run=dry_run)
        if error or dry_run:
            return result
        stamp = _stamp_for(work, result, baseline, final, results, stack)
        if binaries is not None:
            # Parallel checkout: writing ~5,400 files is the largest step left after the baseline pack.
            work.run("-c", "checkout.workers=2", "-c", "checkout.thresholdForParallelism=100",
                     "read-tree", "-u", "--reset", final)
            work.run("update-ref", "refs/heads/rigstack", final)
            binaries.wait()
            _record_compiled(work, source, pins, flavour, untracked)
            history.record(repo, stamp)
        else:
            _record_compiled(work, source, pins, flavour, untracked)
            work.run("read-tree", baseline)
            # The index knows no stat data yet; one refresh (hashing what it must) lets the checkout trust it.
            work.run("update-index", "-q", "--refresh")
            checkout(work, baseline, final, stamp)
        return _finish(result, work, stamp)


def _record_compiled(repo: PackageRepo, source: Source, pins: Pins, flavour: str, untracked: list[str]) -> None:
    """Keep what the package's compiled files hash to: a folder's are checked against its wheel's RECORD first; a
    wheel's were just copied from the cache of the wheel whose sha256 was checked; an image's are taken as found."""
    copied = source.pinned_wheel(pins) is not None
    reference = compiled.reference_of(repo.package, pins, flavour) if copied or source.in_place else \
        compiled.Reference({})
    paths = [path for path in untracked if compiled.is_compiled(path)]
    manifest, wrong = compiled.survey(repo.package, paths, reference, copied)
    if wrong:
        raise compiled.refusal(repo.package, wrong, manifest, pins, flavour)
    compiled.save(repo.git_dir.parent, manifest)


def _refuse_changed_compiled(repo: PackageRepo, pins: Pins, flavour: str, dry_run: bool) -> None:
    """A write into a compiled file is an edit git cannot see: named, like edits of text files, before any work."""
    manifest, wrong = compiled.check(repo, pins, flavour)
    if wrong:
        raise compiled.refusal(repo.package, wrong, manifest, pins, flavour)
    if not dry_run and manifest != compiled.load(repo.git_dir.parent):
        compiled.save(repo.git_dir.parent, manifest)  # fresh stat data, or the first manifest of an older package


def _holds_history(repo: PackageRepo) -> bool:
    """Whether the state beside the package is a record to keep (a stamp, a journal, a checkout's index or a patch
    commit): the stamp is then rebuilt from it. A first apply killed before its checkout leaves none of them."""
    if not repo.package.is_dir():
        return False  # a wheel apply killed between moving its history and its package into place
    kept = (repo.package / STAMP_NAME, journal.journal_path(repo.git_dir.parent), repo.git_dir / "index")
    if any(path.exists() for path in kept):
        return True
    head = repo.rev("HEAD")
    return head is not None and head != repo.root(head)


def _forget(repo: PackageRepo) -> None:
    """Remove the state a failed first apply created beside a package; the package itself was not touched."""
    state = repo.git_dir.parent
    if (repo.package / STAMP_NAME).exists() or (state / JOURNAL).exists() or not state.is_dir():
        return
    for entry in state.iterdir():
        if entry.name != LOCK:  # the lock stays held until the run ends (target_lock removes it)
            shutil.rmtree(entry, ignore_errors=True) if entry.is_dir() else entry.unlink()


def _update(repo: PackageRepo, source: Source, stack: Stack, pins: Pins, dry_run: bool,
            notes: tuple[str, ...]) -> StackResult:
    """A package rigstack patched before: recover, refuse user edits, then no-op, or replay only the changed tail."""
    if not (repo.git_dir / "index").exists() and repo.rev("HEAD"):
        repo.run("read-tree", "HEAD")  # a lost index is rebuilt from the history, or every file would look changed
    notes = notes + (() if dry_run else journal.recover(repo))
    dirty = repo.dirty_files()
    if dirty:
        more = f" and {len(dirty) - 1} more" if len(dirty) > 1 else ""
        raise UserError(f"{repo.package} has changes that are not in the stack ({dirty[0]}{more}); nothing was "
                        f"touched. Keep them as a patch, or discard them with `git --git-dir={repo.git_dir} "
                        f"--work-tree={repo.package} checkout -- .`")
    checked = history.check(repo, pins, source.flavour)
    if checked is None:
        raise UserError(f"{repo.package}: the history in {repo.git_dir.parent} is missing (no commit); remove "
                        f"{repo.git_dir.parent} and reapply")
    stamp, baseline, head, applied, wrong = (checked.stamp, checked.baseline, checked.head, checked.applied,
                                             checked.wrong)
    _refuse_changed_compiled(repo, pins, stamp.flavour, dry_run)
    if wrong:
        # The history is the record; the stamp is derived from it, so a stamp that was edited is rebuilt, not trusted.
        notes = notes + (f"the stamp disagreed with the package's git history ({wrong}); "
                         f"{'would rewrite' if dry_run else 'rewrote'} it from the history",)
    keep = 0
    for (_, done), patch in zip(applied, stack.patches):
        if (done.file, done.sha256) != (patch.file, patch.sha256):
            break
        keep += 1
    if keep == len(applied) == len(stack.patches):
        if wrong and not dry_run:
            history.record(repo, stamp)
        return StackResult(str(repo.package), source.label, stamp.flavour, stamp.baseline_fingerprint,
                           stack.stack_hash, tuple(PatchResult(p.id, p.file, p.status) for p in stamp.patches),
                           notes + ("already applied: the package's history holds this stack; nothing to do",),
                           dry_run=dry_run)
    start = applied[keep - 1][0] if keep else baseline
    kept = [PatchResult(patch.id, patch.file, done.status) for (_, done), patch in zip(applied, stack.patches[:keep])]
    with _scratch_git(repo, dry_run, reuse=True) as work:
        results, final, error = commit_series(work, start, stack.patches[keep:])
        notes = notes + (f"kept {keep} applied patch(es); replayed {len(stack.patches) - keep} on top",)
        result = StackResult(str(repo.package), source.label, stamp.flavour, stamp.baseline_fingerprint,
                             stack.stack_hash, tuple(kept + results), notes, error, dry_run=dry_run)
        if error or dry_run:
            return result
        stamp = _stamp_for(work, result, baseline, final, kept + results, stack)
        checkout(work, head, final, stamp)
        return _finish(result, work, stamp)


def _verify_baseline(printer: Fingerprint, source: Source, pins: Pins) -> str:
    """The flavour whose pinned fingerprint the files match; anything else is the wrong baseline."""
    # Only a wheel names its flavour; an image or a folder may be either pinned one.
    expected = pins.fingerprint(source.flavour) if source.flavour else None
    flavour = match_flavour(printer.value, pins)
    if flavour and (expected is None or flavour == source.flavour):
        return flavour
    if source.flavour and not expected:
        return source.flavour  # nothing pinned yet: the sha256 vouched for it
    flavours = (source.flavour,) if source.flavour else FLAVOURS
    raise UserError(f"{source.label} is not the pinned vLLM {pins.vllm_version} baseline: first difference "
                    f"{first_difference(printer.files, pins, flavours)}; start from a pristine package "
                    f"(`{command('apply --from wheel')}`)")


@contextmanager
def _scratch_git(repo: PackageRepo, dry_run: bool, reuse: bool = False) -> Iterator[PackageRepo]:
    """The repo itself, or for a dry run a throwaway one whose new objects go to a temporary folder."""
    if not dry_run:
        yield repo
        return
    with tempfile.TemporaryDirectory(prefix="rigstack-check-") as tmp:
        if reuse:
            objects = Path(tmp) / "objects"
            objects.mkdir()
            yield PackageRepo(repo.package, git_dir=repo.git_dir, object_dir=objects)
        else:
            yield PackageRepo(repo.package, git_dir=Path(tmp) / "git")


def _stamp_for(repo: PackageRepo, result: StackResult, baseline: str, head: str, results, stack: Stack) -> Stamp:  # noqa: ANN001
    by_id = {patch.id: patch for patch in stack.patches}
    return Stamp(tool_version=__version__, vllm_version=version_of(repo, baseline), flavour=result.flavour,
                 source=result.source, baseline_fingerprint=result.fingerprint, baseline_commit=baseline,
                 head_commit=head, stack_hash=stack.stack_hash,
                 patches=tuple(StampedPatch(id=r.id, file=r.file, sha256=by_id[r.id].sha256, status=r.status)
                               for r in results))


def _finish(result: StackResult, repo: PackageRepo, stamp: Stamp) -> StackResult:
    diff_path = write_atomic(repo.git_dir.parent / COMBINED_DIFF, repo.diff(stamp.baseline_commit, stamp.head_commit))
    return _replace(result, written=True, combined_diff=str(diff_path))


def _relocated(result: StackResult, package: Path) -> StackResult:
    diff = str(state_dir_for(package) / COMBINED_DIFF) if result.combined_diff else None
    return _replace(result, package=str(package), combined_diff=diff)


def _replace(result: StackResult, **changes) -> StackResult:  # noqa: ANN003
    return StackResult(**{**asdict(result), "patches": result.patches, **changes})


