"""Resuming a stopped port: --continue after a fix by hand, --skip to drop the conflicting patch."""

from __future__ import annotations

from pathlib import Path

from rigstack.errors import UserError
from rigstack.port.classify import _record
from rigstack.port.conflicts import _MARKERS, _report
from rigstack.port.replay import _replay
from rigstack.port.state import PortReport, PortState, _repo, _save, port_command
from rigstack.stack import load_stack


def _continue(work: Path, state: PortState, skip: bool) -> PortReport:
    stack = load_stack(Path(state.patches_dir))
    if stack.stack_hash != state.stack_hash:
        raise UserError(f"{state.patches_dir} changed since the port started; restore it, or drop the port with "
                        f"`{port_command(work.parent, '--abort')}` and start again")
    if state.status in ("done", "written"):
        raise UserError(f"the port to {state.new.version} in {work} has no open conflict ({state.status}); "
                        + (f"accept it with `{port_command(work.parent, '--write')}`" if state.status == "done"
                           else f"start the next one with `{port_command(work.parent, '--to VERSION')}`"))
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
                                f"`{port_command(work.parent, '--continue')}` (or --skip to drop the patch)")
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
