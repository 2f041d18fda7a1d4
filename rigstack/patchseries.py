"""A series of patches applied in git's object store: each checked against a scratch index and committed, in order, so
nothing reaches the work tree until the whole series applies (rigstack.applier then checks it out in one step).

API:
    commit_series(repo, start, patches) -> (results, head, error): PatchResult per patch, the last commit made, and
        the one-line error of the first patch that does not apply (or does not compile), else None.
    lines_already_there(patch, text_of, before_of) -> (present, added); looks_upstreamed(present, added, where) -> str
    offsets(output, shown=3) -> str: the hunks git applied at other lines, as one line.
"""

from __future__ import annotations

import re
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from rigstack.errors import UserError
from rigstack.gitrepo import PackageRepo
from rigstack.history import commit_message
from rigstack.stack import Patch

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
        moved = offsets(forward.output)
        if moved:
            return PatchResult(patch.id, patch.file, "offset", f"needs refresh: {moved}")
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


def offsets(output: str, shown: int = 3) -> str:
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
    changed = [path for path in repo.changed_files(start, commit) if path.endswith(".py")]
    for path, source in repo.blobs_at(commit, changed):
        # Blame the last patch that names the file; git's list and the parser's agree for every accepted patch.
        owner = next((patch for patch in reversed(patches) if path in patch.touched_files), patches[-1])
        try:
            compile(source, f"vllm/{path}", "exec")
        except SyntaxError as error:
            return owner.id, f"vllm/{path} line {error.lineno} does not compile ({error.msg})"
    return None
