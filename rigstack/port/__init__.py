"""Port the patch stack to another vLLM release with git's 3-way merges, resumable like `git am -3`.

A port lives in a work area, build/port-<old>-to-<new>/, laid out like a package apply.py patched:
- vllm/ (work tree) and vllm.rigstack/git (its git dir beside it), plus port.json (the state of the port);
- refs/port/old-baseline: the pinned release's text files (fast-import; compiled objects are left out, as apply.py
  does), with the old stack committed on top by the applier's own code (refs/port/old-stack);
- refs/port/new-baseline: the target release's text files, a second root commit in the same object store;
- refs/heads/rigstack: the new line. Each patch is replayed onto it by a cherry-pick done in the object store: a
  3-way merge whose base is the patch's parent on the old line, with rename detection, so a patch follows a file
  that moved upstream. Only a conflict writes the work tree (its files then hold diff3-style markers).

The package's modules, in the order a port runs: state (port.json and the report), start (both releases in one
history), store (one cached git store per wheel), replay (a cherry-pick per patch), classify (each patch's
status), drift and conflicts, resume (--continue, --skip), finish, cpu (the CPU twin) and write (--write).
Rendering is rigstack/output/port.py.

Statuses: clean (same hunks; only the blob ids in the index lines change), refreshed (offset, or merged by git or
by hand: the patch text changes), upstreamed (the merge leaves nothing to change, or the patch's reverse applies to
the new release; a patch the old release already held is merged as the change it is, so it is upstreamed only if
the new release holds it too), moved (a file it touches was renamed upstream and the patch followed it), conflict
(which says "looks upstreamed" when most lines it adds are in the new release), dropped (--skip). Clean, refreshed
and moved patches also get a drift warning for every function they touch that changed upstream between the two
releases.

`--write` replaces the stack in patches/ (same header, numbering kept, written by patched.export) and the pins in
versions.env. A patch that was upstreamed or dropped is removed and a note takes its place: NNNN-slug.upstreamed
or NNNN-slug.dropped, holding why and the old header; load_stack reads only *.patch and the id stays taken.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from rigstack import treeswap
from rigstack.baseline import parse_base, parse_source
from rigstack.errors import UserError
from rigstack.port.resume import _continue
from rigstack.port.start import _base, _start
from rigstack.port.state import (ACTIONS, LOCK_DIR, STATE, PortReport, PortState, _find_work, _load, _repo,
                                 port_command)
from rigstack.port.write import _write
from rigstack.stack import DEFAULT_PATCHES_DIR
from rigstack.versions import VERSIONS_FILE, Pins
from rigstack.wheelindex import newest_release

# The package's API; _load and _repo read a work area (the tests look into one).
__all__ = ["LOCK_DIR", "PortReport", "PortState", "_load", "_repo", "action_of", "port"]


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
    treeswap.recover(patches_dir.parent)  # a --write killed half way is finished before anything reads the state
    if action in ("start", "report-only"):
        if not to:
            raise UserError("--to VERSION is required to start a port, e.g. "
                            f"`{port_command(work_root, '--to 0.33.0')}`")
        if to == "latest":  # how the project learns of a release the week it appears (CI runs it)
            to = newest_release("vllm")
            if to == pins.vllm_version and not base:
                return PortReport(None, None, message=f"vLLM {to} is the newest release on the package index and "
                                                      "the pin already: nothing to port")
        old = _base(parse_base(base), base_sha256, pins) if base else None
        return _start(to, parse_source(source), patches_dir, sha256, pins, work_root, action == "report-only", old)
    if base or base_sha256:
        raise UserError("--base is given when starting a port; the port in progress keeps its own")
    work = _find_work(work_root, to)
    if action == "abort":
        state = _load(work)
        treeswap.discard([Path(state.patches_dir), versions_file, work / STATE])  # a --write killed while staging
        shutil.rmtree(work)
        written = " (the stack and pins it wrote stay: use git to undo them)" if state.status == "written" else ""
        return PortReport(None, state, message=f"removed {work}: patches/ and versions.env are as before the "
                                                f"port{written}")
    state = _load(work)
    if action == "write":
        return _write(work, state, pins, versions_file)
    return _continue(work, state, skip=action == "skip")
