"""Apply the stack to a vLLM package with git: a baseline commit, one commit per patch, a stamp, a combined diff.

Every patch is checked and committed in git's object store (against a scratch index) before the work tree is
touched, so a stack that fails leaves the package exactly as it was. Only then does one checkout write the files
the stack changes; a journal makes that last step recoverable if it is interrupted.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import re
import shutil
import tempfile
import zipfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path

from rigstack import __version__
from rigstack.atomic import write_atomic
from rigstack.baseline import (BinaryWriter, Fingerprint, PackageFile, Source, first_difference,
                               ignore_binaries, match_flavour, tracked_entries)
from rigstack.cache import cache_dir
from rigstack.errors import UserError
from rigstack.gitrepo import PackageRepo, state_dir_for
from rigstack.stack import SEPARATOR, Patch, Stack, stack_hash
from rigstack.stamp import STAMP_NAME, Stamp, StampedPatch, read_stamp, write_stamp
from rigstack.versions import FLAVOURS, Pins, package_version

COMBINED_DIFF = "all-changes-vs-baseline.diff"
JOURNAL = "applying.json"
LOCK = "lock"
TRAILER = "Rigstack-Patch: "
# Statuses that let the stack go on; any other stops it before anything is written.
GOOD = ("applied", "offset", "already-applied")
_OFFSET = re.compile(r"Hunk #(\d+) succeeded at (\d+) \(offset (-?\d+) lines?\)")
_CHECKING = re.compile(r"Checking patch (.+)\.\.\.$")
# What `git apply` says about a hunk that does not fit and a file that is not there (the importer reads them too).
GIT_APPLY_FAILED_AT = re.compile(r"error: patch failed: (.+):(\d+)")
GIT_APPLY_MISSING = re.compile(r"error: (.+): (does not exist in index|No such file)")


@dataclass(frozen=True)
class PatchResult:
    id: str
    file: str
    status: str  # applied, offset, already-applied, fuzz, conflict, missing-file, compile-error, not-reached
    detail: str = ""


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
    package = source.package(pins, out)
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
    if repo.exists and (read_stamp(package) is not None or (repo.git_dir.parent / JOURNAL).exists()):
        return _update(repo, source, stack, pins, dry_run, notes)
    if repo.exists and not dry_run:
        # A first apply killed before its checkout (which writes the journal first) left only the state beside the
        # package; the package itself was never touched. Start over.
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


@contextmanager
def target_lock(state: Path, target: Path, what: str = "apply") -> Iterator[None]:
    """One apply (or port) at a time per target: an flock on a file in its state folder, holding the owner's pid.

    The kernel drops an flock when its process dies, so a killed run never blocks the next one. Folders made only
    to hold the lock are removed again when nothing else was put in them."""
    missing = [folder for folder in (state, *state.parents) if not folder.exists()]
    state.mkdir(parents=True, exist_ok=True)
    path = state / LOCK
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 20, 0).decode(errors="replace").strip() or "unknown"
            os.close(fd)
            raise UserError(f"another {what} (pid {holder}) is working on {target}; wait for it to finish, "
                            "then rerun") from None
        try:
            same = os.stat(path).st_ino == os.fstat(fd).st_ino
        except FileNotFoundError:
            same = False
        if same:
            break
        os.close(fd)  # the holder removed the file after we opened it: take the lock on the new one
    try:
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        yield
    finally:
        if [entry.name for entry in state.iterdir()] == [LOCK]:
            path.unlink()
            for folder in missing:
                try:
                    folder.rmdir()
                except OSError:  # someone else's files arrived meanwhile
                    break
        os.close(fd)


def _remove_leftovers(repo: PackageRepo, source: Source) -> tuple[str, ...]:
    """What killed runs left (under the lock, so no other run is using it): git's lock files, staging folders."""
    notes = []
    stale = repo.remove_stale_locks()
    if stale:
        notes.append(f"removed git's {', '.join(stale)} left by a killed run")
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
    needed = [folder] + ([package] if source.in_place and package.is_dir() else [])
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
    _check_free(out.parent, needed)


def _check_free(folder: Path, needed: int) -> None:
    free = shutil.disk_usage(folder).free
    if free < needed:
        raise UserError(f"{folder} has {free / 1e6:.0f} MB free but this apply needs {needed / 1e6:.0f} MB; free "
                        f"{(needed - free) / 1e6:.0f} MB or pass another --out; nothing was changed")


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
            write_stamp(repo.package, stamp)
        else:
            work.run("read-tree", baseline)
            # The index knows no stat data yet; one refresh (hashing what it must) lets the checkout trust it.
            work.run("update-index", "-q", "--refresh")
            _checkout(work, baseline, final, stamp)
        return _finish(result, work)


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
    recovered = () if dry_run else _recover(repo)
    notes = notes + recovered
    dirty = repo.dirty_files()
    if dirty:
        more = f" and {len(dirty) - 1} more" if len(dirty) > 1 else ""
        raise UserError(f"{repo.package} has changes that are not in the stack ({dirty[0]}{more}); nothing was "
                        f"touched. Keep them as a patch, or discard them with `git --git-dir={repo.git_dir} "
                        f"--work-tree={repo.package} checkout -- .`")
    stamp = read_stamp(repo.package)
    head = repo.rev("HEAD")
    if stamp is None or head is None:
        raise UserError(f"{repo.package}: the stamp or the history in {repo.git_dir.parent} is missing; remove "
                        f"{repo.git_dir.parent} and reapply")
    baseline = repo.root(head)
    applied = _applied_patches(repo, baseline, head)
    wrong = _stamp_disagreement(repo, stamp, baseline, head, applied, pins)
    if wrong:
        # The history is the record; the stamp is derived from it, so a stamp that was edited is rebuilt, not trusted.
        stamp = _stamp_from_history(repo, baseline, head, applied, pins, stamp.flavour)
        notes = notes + (f"the stamp disagreed with the package's git history ({wrong}); "
                         f"{'would rewrite' if dry_run else 'rewrote'} it from the history",)
    keep = 0
    for (_, done), patch in zip(applied, stack.patches):
        if (done.file, done.sha256) != (patch.file, patch.sha256):
            break
        keep += 1
    if keep == len(applied) == len(stack.patches):
        if wrong and not dry_run:
            write_stamp(repo.package, stamp)
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
        _checkout(work, head, final, _stamp_for(work, result, baseline, final, kept + results, stack))
        return _finish(result, work)


def _stamp_disagreement(repo: PackageRepo, stamp: Stamp, baseline: str, head: str,
                        applied: list[tuple[str, StampedPatch]], pins: Pins | None) -> str | None:
    """The first stamp field the package's git history (or, with pins, the pinned fingerprint) contradicts."""
    patches = tuple(done for _, done in applied)
    expected = {"head_commit": head, "baseline_commit": baseline, "patches": patches,
                "stack_hash": stack_hash(patches), "vllm_version": _version_of(repo, baseline)}
    wrong = next((name for name, value in expected.items() if getattr(stamp, name) != value), None)
    pinned = pins.fingerprint(stamp.flavour) if pins and stamp.flavour in FLAVOURS else None
    if wrong is None and pinned and pinned != stamp.baseline_fingerprint:
        wrong = "baseline_fingerprint"
    return wrong


def _stamp_from_history(repo: PackageRepo, baseline: str, head: str, applied: list[tuple[str, StampedPatch]],
                        pins: Pins, flavour: str) -> Stamp:
    """Every field of a stamp read back from git: the baseline's files, its commit message, the patch commits."""
    printer = Fingerprint()
    for path, data in repo.file_blobs(baseline, ".py"):
        printer.add(path, data)
    patches = tuple(done for _, done in applied)
    label = repo.message(baseline).removeprefix("baseline: ").strip()
    return Stamp(tool_version=__version__, vllm_version=_version_of(repo, baseline),
                 flavour=match_flavour(printer.value, pins) or flavour, source=label,
                 baseline_fingerprint=printer.value, baseline_commit=baseline, head_commit=head,
                 stack_hash=stack_hash(patches), patches=patches)


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
                    f"(`python apply.py apply --from wheel`)")


def commit_series(repo: PackageRepo, start: str,
                  patches: tuple[Patch, ...] | list[Patch]) -> tuple[list[PatchResult], str, str | None]:
    """Apply each patch to a scratch index and commit it; stop at the first that does not apply."""
    results: list[PatchResult] = []
    parent = start
    with tempfile.TemporaryDirectory(prefix="rigstack-index-") as tmp:
        index = Path(tmp) / "index"
        repo.read_tree_into(index, repo.tree_of(start))
        for position, patch in enumerate(patches):
            result = _apply_one(repo, patch, index)
            results.append(result)
            if result.status not in GOOD:
                results += [PatchResult(p.id, p.file, "not-reached") for p in patches[position + 1:]]
                return results, parent, _failure_message(patch, result)
            tree = repo.write_tree(index)
            parent = repo.commit_tree(tree, parent, commit_message(patch, result.status))
        _refuse_symlinked_paths(repo, start, parent)
        broken = _compile_errors(repo, start, parent, patches)
        if broken:
            patch_id, message = broken
            results = [PatchResult(r.id, r.file, "compile-error", message) if r.id == patch_id else r
                       for r in results]
            return results, parent, f"patch {patch_id}: {message}; fix the patch"
    return results, parent, None


def _apply_one(repo: PackageRepo, patch: Patch, index: Path) -> PatchResult:
    forward = repo.apply_to_index(patch.path, index)
    if forward.ok:
        offsets = _offsets(forward.output)
        if offsets:
            return PatchResult(patch.id, patch.file, "offset", f"needs refresh: {offsets}")
        return PatchResult(patch.id, patch.file, "applied")
    if repo.apply_to_index(patch.path, index, "--check", "-R").ok:
        # The baseline was verified pristine, so a change already in it came from upstream.
        return PatchResult(patch.id, patch.file, "already-applied",
                           "its change is already in the baseline (looks upstreamed)")
    missing = GIT_APPLY_MISSING.search(forward.output)
    if missing:
        return PatchResult(patch.id, patch.file, "missing-file", f"{missing.group(1)} does not exist in the package")
    failed = GIT_APPLY_FAILED_AT.search(forward.output)
    where = _hunk_at(patch, failed.group(1), int(failed.group(2))) if failed else "a hunk"
    tree = repo.write_tree(index)
    lead = looks_upstreamed(*lines_already_there(patch, lambda path: repo.blob_text(tree, path)), "the baseline")
    but = f", but it {lead} (drop it if the baseline does what it does)" if lead else ""
    if repo.apply_to_index(patch.path, index, "--check", "-C1").ok:
        return PatchResult(patch.id, patch.file, "fuzz", f"{where} applies only with fuzz{but}")
    return PatchResult(patch.id, patch.file, "conflict", f"{where} does not apply{but}")


def _offsets(output: str, shown: int = 3) -> str:
    """The hunks git applied at other lines, by file (git numbers hunks per file); empty when none moved."""
    moved, path = [], ""
    for line in output.splitlines():
        checking, offset = _CHECKING.match(line), _OFFSET.match(line)
        path = checking.group(1) if checking else path
        if offset:
            moved.append((path, f"hunk {offset.group(1)} by {int(offset.group(3)):+d} lines"))
    by_file: dict[str, list[str]] = {}
    for path, hunk in moved[:shown]:
        by_file.setdefault(path, []).append(hunk)
    listed = "; ".join(f"vllm/{path}: {', '.join(hunks)}" for path, hunks in by_file.items())
    left = len(moved) - shown
    return listed + (f" and {left} more hunk{'s' if left > 1 else ''}" if left > 0 else "")


LOOKS_UPSTREAMED = 0.8  # a conflicting patch with this share of its added lines already there was most likely taken


def lines_already_there(patch: Patch, text_of: Callable[[str], str | None],
                        before_of: Callable[[str], str | None] = lambda path: None) -> tuple[int, int]:
    """(how many of the lines the patch adds text_of(path) already holds, how many it adds). Blank lines, and lines
    that were there before it (its own context and removed lines, and before_of(path)), say nothing about the change
    having been taken, so they do not count."""
    present = added = 0
    for path, hunks in patch.hunks.items():
        body = [text for hunk in hunks for text in hunk.lines]
        before = _stripped_lines(before_of(path)) | {text[1:].strip() for text in body if not text.startswith("+")}
        there = _stripped_lines(text_of(path))
        for line in (text[1:].strip() for text in body if text.startswith("+")):
            if line and line not in before:
                added += 1
                present += line in there
    return present, added


def looks_upstreamed(present: int, added: int, where: str) -> str:
    """The words for a conflict whose added lines are mostly in `where` already; empty for any other."""
    if not added or present / added < LOOKS_UPSTREAMED:
        return ""
    return f"looks upstreamed: {present} of the {added} lines it adds ({100 * present // added}%) are in {where}"


def _stripped_lines(text: str | None) -> set[str]:
    return {line.strip() for line in (text or "").splitlines()}


def _hunk_at(patch: Patch, path: str, line: int) -> str:
    hunk = next((hunk for hunk in patch.hunks.get(path, []) if hunk.old_start == line), None)
    return f"hunk {hunk.number} of vllm/{path} (line {line})" if hunk else f"vllm/{path} at line {line}"


def _failure_message(patch: Patch, result: PatchResult) -> str:
    # The baseline was verified to be the pin: a patch that does not fit it was made against other source.
    advice = "Refresh the patch against the pinned vLLM (patches/README.md says how)" \
        if result.status in ("fuzz", "conflict") else "Check the baseline or drop the patch"
    return f"patch {patch.file}: {result.detail}. {advice}; nothing was written."


def _refuse_symlinked_paths(repo: PackageRepo, old: str, new: str) -> None:
    """A file the stack writes must not sit under a symlink: the write would land outside the package."""
    root = repo.package.resolve()
    for path in repo.changed_files(old, new):
        parent = (repo.package / path).parent
        if parent.exists() and not parent.resolve().is_relative_to(root):
            raise UserError(f"the stack writes vllm/{path}, but {parent} is a symlink out of the package; "
                            "remove the link or the patch")


def _compile_errors(repo: PackageRepo, start: str, commit: str,
                    patches: tuple[Patch, ...] | list[Patch]) -> tuple[str, str] | None:
    """Compile every Python file git changed between start and commit, before any of it reaches the work tree.

    The list comes from git, not from the patch parser: whatever git applied is checked, even a file the parser
    did not see."""
    for path in repo.changed_files(start, commit):
        if not path.endswith(".py"):
            continue
        # Blame the last patch that names the file; git's list and the parser's agree for every accepted patch.
        owner = next((patch for patch in reversed(patches) if path in patch.touched_files), patches[-1])
        try:
            compile(repo.run("cat-file", "blob", f"{commit}:{path}"), f"vllm/{path}", "exec")
        except SyntaxError as error:
            return owner.id, f"vllm/{path} line {error.lineno} does not compile ({error.msg})"
    return None


def commit_message(patch: Patch, status: str) -> str:
    # A short first line keeps `git log --oneline` readable; export drops it again.
    return (f"{patch.id}: {patch.header.subject}\n\n{patch.header_text}\n{TRAILER}{patch.file}\n"
            f"Rigstack-Id: {patch.id}\nRigstack-Sha256: {patch.sha256}\nRigstack-Status: {status}\n")


def _trailers(message: str) -> dict[str, str]:
    _, _, block = message.rpartition("\n" + TRAILER)
    lines = (TRAILER + block).splitlines() if block else []
    return {key: value for key, _, value in (line.partition(": ") for line in lines)}


def _applied_patches(repo: PackageRepo, baseline: str, head: str) -> list[tuple[str, StampedPatch]]:
    """(commit, what it applied) for each patch commit on the package's history, from the commits' trailers."""
    entries = []
    for commit, message in repo.log(baseline, head):
        trailer = _trailers(message)
        file = trailer.get("Rigstack-Patch", "")
        entries.append((commit, StampedPatch(id=trailer.get("Rigstack-Id", file[:4]), file=file,
                                             sha256=trailer.get("Rigstack-Sha256", ""),
                                             status=trailer.get("Rigstack-Status", "applied"))))
    return entries


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
    return Stamp(tool_version=__version__, vllm_version=_version_of(repo, baseline), flavour=result.flavour,
                 source=result.source, baseline_fingerprint=result.fingerprint, baseline_commit=baseline,
                 head_commit=head, stack_hash=stack.stack_hash,
                 patches=tuple(StampedPatch(id=r.id, file=r.file, sha256=by_id[r.id].sha256, status=r.status)
                               for r in results))


def _version_of(repo: PackageRepo, commit: str) -> str:
    return package_version((repo.blob_text(commit, "_version.py") if commit else None) or "") or "unknown"


def _checkout(repo: PackageRepo, old: str, new: str, stamp: Stamp) -> None:
    """The one step that writes the package; a journal beside it lets the next run finish an interrupted one."""
    changed = repo.changed_files(old, new)
    # What the checkout writes, plus room for the index it rewrites and the stamp.
    _check_free(repo.package, repo.blob_sizes(new, changed) + 2 * _size(repo.git_dir / "index") + (1 << 20))
    journal = repo.git_dir.parent / JOURNAL
    journal.write_text(json.dumps({"target": new, "stamp": stamp.to_dict()}))
    repo.checkout(old, new)
    write_stamp(repo.package, stamp)
    journal.unlink()


def _size(path: Path) -> int:
    return path.stat().st_size if path.is_file() else 0


def _recover(repo: PackageRepo) -> tuple[str, ...]:
    journal = repo.git_dir.parent / JOURNAL
    if not journal.is_file():
        return ()
    entry = json.loads(journal.read_text())
    repo.reset_hard(entry["target"])
    write_stamp(repo.package, Stamp.from_dict(entry["stamp"]))
    journal.unlink()
    return (f"recovered an interrupted apply: the package now holds {entry['target'][:12]}",)


def _finish(result: StackResult, repo: PackageRepo) -> StackResult:
    stamp = read_stamp(repo.package)
    assert stamp is not None
    diff_path = write_atomic(repo.git_dir.parent / COMBINED_DIFF, repo.diff(stamp.baseline_commit, stamp.head_commit))
    return _replace(result, written=True, combined_diff=str(diff_path))


def _relocated(result: StackResult, package: Path) -> StackResult:
    diff = str(state_dir_for(package) / COMBINED_DIFF) if result.combined_diff else None
    return _replace(result, package=str(package), combined_diff=diff)


def _replace(result: StackResult, **changes) -> StackResult:  # noqa: ANN003
    return StackResult(**{**asdict(result), "patches": result.patches, **changes})


# --- reading a patched package --------------------------------------------------------------------------------------

def _patched_repo(package: Path) -> tuple[PackageRepo, Stamp]:
    repo = PackageRepo(package.absolute())
    stamp = read_stamp(package)
    if not repo.exists or stamp is None:
        raise UserError(f"{package} was not patched by rigstack (no stamp or no {repo.git_dir}); "
                        f"run `python apply.py apply --from dir:{package}`")
    return repo, stamp


def status(package: Path) -> dict:
    """What is applied to a package, from its stamp and its git history."""
    repo, stamp = _patched_repo(package)
    head = repo.rev("HEAD")
    baseline = repo.root(head) if head else ""
    applied = _applied_patches(repo, baseline, head) if head else []
    commits = {done.file: commit for commit, done in applied}
    wrong = _stamp_disagreement(repo, stamp, baseline, head, applied, None) if head else "head_commit"
    return {
        "package": str(package), "vllm_version": stamp.vllm_version, "flavour": stamp.flavour,
        "source": stamp.source, "stack_hash": stamp.stack_hash, "baseline_fingerprint": stamp.baseline_fingerprint,
        "stamp_matches_history": wrong is None,
        "stamp_disagrees_on": wrong,
        "dirty_files": repo.dirty_files(),
        "patches": [{"id": p.id, "file": p.file, "status": p.status, "commit": commits.get(p.file, "")}
                    for p in stamp.patches],
    }


def export(package: Path, to: Path) -> list[Path]:
    """Regenerate the patch files from the package's commits (header from the message, diff from git).

    A patch whose change the baseline already held (already-applied) made a commit with no diff: there is nothing to
    regenerate it from. The others are written, then an error names the ones left out, so a script that replaces
    patches/ with the export stops before it loses them."""
    repo, stamp = _patched_repo(package)
    to.mkdir(parents=True, exist_ok=True)
    written, left_out = [], []
    commits = repo.log(stamp.baseline_commit, stamp.head_commit)
    for commit, message in commits:
        trailer = _trailers(message)
        header = message[message.index("\n\n") + 2: message.rindex("\n" + TRAILER)]
        diff = repo.diff(commit + "^", commit, renames=True)  # an imported rename stays one, as it was written
        if not diff:
            left_out.append(trailer["Rigstack-Patch"])
            continue
        written.append(write_atomic(to / trailer["Rigstack-Patch"], header + SEPARATOR + diff))
    if left_out:
        raise UserError(f"{to}: wrote {len(written)} of {len(commits)} patch files; left out {', '.join(left_out)}: "
                        "the baseline already held their change (already-applied), so their commits hold no diff "
                        "to export. Keep the original patch files as they are")
    return written


def combined_diff(package: Path) -> str:
    repo, stamp = _patched_repo(package)
    return repo.diff(stamp.baseline_commit, stamp.head_commit)


def laid_files(package: Path) -> list[str]:
    """Package-relative files the stack added or changed, plus the stamp: what an image lays over its base."""
    repo, stamp = _patched_repo(package)
    return repo.changed_files(stamp.baseline_commit, stamp.head_commit) + [STAMP_NAME]
