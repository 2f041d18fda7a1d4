"""Classification of a replayed patch: clean, refreshed, moved or upstreamed, by the change it makes on the new line."""

from __future__ import annotations

from rigstack import history
from rigstack.gitrepo import PackageRepo
from rigstack.port.drift import _drift
from rigstack.port.state import PortState, PortedPatch
from rigstack.stack import Patch, parse_hunks


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
    entry.commit = repo.commit_tree(tree, state.head, history.commit_message(patch, entry.status))
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
