"""Replaying the stack onto the new release: one cherry-pick per patch in the object store."""

from __future__ import annotations

import tempfile
from pathlib import Path

from rigstack import history
from rigstack.gitrepo import PackageRepo
from rigstack.port.classify import _record
from rigstack.port.conflicts import _conflict_sites, _lines_upstream, _looks_upstreamed
from rigstack.port.finish import _finish
from rigstack.port.state import PortState, _repo, _save
from rigstack.stack import Patch, Stack


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
        elif (waits := _waits_on(repo, state, position, outcome.conflicted, head_tree)) and not stop \
                and set(waits) == set(outcome.conflicted):
            # Every file it conflicts in is one an earlier patch creates and that patch is not on the new line yet:
            # git says "deleted in vllm-X", but nothing upstream deleted it. Resolving the earlier patch decides.
            entry.status, entry.files, entry.detail = "waiting", list(outcome.conflicted), "; ".join(waits.values())
        else:
            entry.status, entry.files = "conflict", list(outcome.conflicted)
            entry.conflicts = [site for site in _conflict_sites(repo, patch, outcome.tree, outcome.conflicted,
                                                                outcome.messages, state.old.version)
                               if site.file.removeprefix("vllm/") not in waits]
            entry.upstream_lines = list(_lines_upstream(repo, base, state.new.commit, patch, outcome.conflicted))
            lead = _looks_upstreamed(entry, state.new.version)
            sites = [f"{site.hunk} of {site.file} (merged lines {site.lines})" for site in entry.conflicts]
            entry.detail = "; ".join([*waits.values(), *([lead] if lead else []), *sites])
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
    return without, repo.commit_tree(old_tree, without, history.commit_message(patch, "already-applied")), True


def _waits_on(repo: PackageRepo, state: PortState, position: int, conflicted: tuple[str, ...],
              head_tree: str) -> dict[str, str]:
    """Conflicted file -> 'waits on NNNN (status), which creates it' for each file an earlier patch creates that is
    not on the new line (that patch is a conflict, still waiting, or dropped)."""
    waits = {}
    for path in conflicted:
        if repo.blob_text(head_tree, path) is not None or repo.blob_text(state.old.commit, path) is not None:
            continue
        for earlier in range(position):
            parent = state.old_commits[earlier - 1] if earlier else state.old.commit
            if repo.blob_text(parent, path) is None and repo.blob_text(state.old_commits[earlier], path) is not None:
                creator = state.patches[earlier]
                waits[path] = f"waits on {creator.id} ({creator.status}), which creates vllm/{path}"
                break
    return waits
