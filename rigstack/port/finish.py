"""Finishing a port: the work area becomes the ported package, with its stamp and the ported patch files."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from rigstack import __version__, patched
from rigstack.gitrepo import PackageRepo
from rigstack.port.cpu import _cpu_check
from rigstack.port.state import PORTED, PortState, _save
from rigstack.stack import load_stack
from rigstack.stamp import Stamp, StampedPatch, write_stamp


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
    patched.export(repo.package, partial)
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
