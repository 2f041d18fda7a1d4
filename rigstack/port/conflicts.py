"""Conflicts: where a patch does not merge (file, hunk, lines), and whether it looks upstreamed."""

from __future__ import annotations

from functools import partial
from pathlib import Path

from rigstack import patchseries
from rigstack.gitrepo import PackageRepo
from rigstack.port.classify import _moved
from rigstack.port.state import ConflictSite, PORTED, PortReport, PortState, PortedPatch, port_command
from rigstack.stack import Hunk, Patch, parse_hunks

_MARKERS = ("<<<<<<< ", "||||||| ", ">>>>>>> ")


def _report(work: Path, state: PortState) -> PortReport:
    command = partial(port_command, work.parent)
    if state.status != "stopped":
        return PortReport(str(work), state, message=f"ported stack in {work / PORTED}; accept it with "
                                                    f"`{command('--write')}`")
    entry = state.patches[state.next]
    first = entry.conflicts[0]
    lead = _looks_upstreamed(entry, state.new.version)
    skip = f"if vLLM {state.new.version} does what the patch does, drop it with `{command('--skip')}`"
    steps = (*((f"it {lead}: {skip}",) if lead else ()),
             f"the work tree {work / 'vllm'} holds the conflict markers (diff3 style: "
             f"<<<<<<< vLLM {state.new.version} ||||||| old base ======= the patch >>>>>>>):",
             *(f"  {site.file} lines {site.lines}: {site.hunk}" for site in entry.conflicts),
             f"  (the patch's change as merged so far: `git --git-dir={work / 'vllm.rigstack' / 'git'} diff HEAD`)",
             f"edit them into the change the patch should make, then `{command('--continue')}`",
             f"`{command('--skip')}` drops this patch (recorded as dropped)",
             f"`{command('--abort')}` removes the port: back to the state before it")
    error = (f"patch {entry.file} conflicts with vLLM {state.new.version} ({first.hunk} of {first.file}); "
             + (f"it {lead}: {skip}, else edit " if lead else "edit ")
             + f"{work / 'vllm'}, then `{command('--continue')}` (or --skip / --abort)")
    return PortReport(str(work), state, error=error, instructions=steps)


def _lines_upstream(repo: PackageRepo, old: str, new: str, patch: Patch,
                    conflicted: tuple[str, ...]) -> tuple[int, int]:
    """(lines the patch adds that the new release already has, lines it adds); lines of the old file do not count."""
    moved = _moved(patch.touched_files, list(conflicted), repo, new)
    return patchseries.lines_already_there(patch, lambda path: repo.blob_text(new, moved.get(path, path)),
                                       lambda path: repo.blob_text(old, path))


def _looks_upstreamed(entry: PortedPatch, version: str) -> str:
    return patchseries.looks_upstreamed(*(entry.upstream_lines or (0, 0)), f"vLLM {version}")


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
