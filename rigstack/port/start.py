"""Starting a port: the two releases fetched and checked, both baselines and the old stack in one git history."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path

from rigstack import applier, patchseries
from rigstack.baseline import (RELEASE, Fingerprint, PackageFile, Source, WheelSource, base_wheel,
                               checked_release_wheel, fetch_wheel, ignore_binaries, tracked_entries)
from rigstack.errors import UserError
from rigstack.gitrepo import PackageRepo, state_dir_for
from rigstack.port.conflicts import _report
from rigstack.port.replay import _replay
from rigstack.port.state import (Baseline, NEW_BASELINE, OLD_BASELINE, OLD_STACK, PortReport, PortState, PortedPatch,
                                 STATE, _NotOnThePin, _load, _repo, _save, _version_in, port_command)
from rigstack.port.store import wheel_baseline
from rigstack.stack import Stack, load_stack
from rigstack.versions import Pins


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
        raise UserError(f"a port to {to} is already in progress in {work}; finish it with "
                        f"`{port_command(work.parent, '--continue')}` (or --skip), or drop it with "
                        f"`{port_command(work.parent, '--abort')}`")
    repo = _repo(work)
    dirty = repo.dirty_files() if state.laid else []
    if dirty:
        more = f" and {len(dirty) - 1} more" if len(dirty) > 1 else ""
        raise UserError(f"{repo.package} has uncommitted changes ({dirty[0]}{more}); nothing was touched. Keep "
                        f"them elsewhere, or discard the port with `{port_command(work.parent, '--abort')}`")


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
    results, final, error = patchseries.commit_series(repo, old_commit, stack.patches)
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
        return wheel_baseline(repo, release.wheel, release.sha256, version, ref)
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
