"""The checks an incoming patch meets before it is applied, and what a failed apply is called.

Each raises a UserError naming the patch (a refusal), except failure, which names the status of a patch git would
not apply. They read the scratch store the importer builds; nothing here writes to patches/.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from rigstack import patchseries
from rigstack.errors import UserError
from rigstack.gitrepo import PackageRepo
from rigstack.importer.diffs import FileDiff
from rigstack.importer.incoming import Incoming
from rigstack.stack import PACKAGE

BASELINE_REF = "refs/import/baseline"


def check_parses(git: PackageRepo, raw: Path, item: Incoming) -> None:
    """git's own reading of the patch (nothing applied): a damaged one is refused with git's words."""
    try:
        git.run("apply", "--numstat", f"-p{item.strip}", str(raw))
    except UserError as error:
        reason = str(error).partition(": ")[2].removeprefix("error: ")
        raise UserError(f"{item.label} ({item.subject}) is not a readable patch: {reason} of its diff; regenerate "
                        "it") from None


def rooted_at_parent(git: PackageRepo, item: Incoming, files: list[FileDiff], head: str) -> bool:
    """Whether the paths start at the package's parent (vllm/x.py, a fork of vLLM) rather than in the package."""
    paths = [path for entry in files for path in entry.paths]
    inside = [path for path in paths if path.split("/")[0] == PACKAGE and path != PACKAGE]
    if item.layout == "fork" or (item.layout is None and inside):
        outside = next((path for path in paths if path not in inside), None)
        if outside:
            raise UserError(f"{item.label} ({item.subject}) touches {outside}, outside the {PACKAGE}/ package; "
                            f"patches may only change files under {PACKAGE}/: split it out of the patch")
        return True
    read = [entry.old for entry in files if entry.old]
    if item.layout is None and read and not any(blob_of(git, head, path) for path in read):
        raise UserError(f"{item.label} ({item.subject}) changes {read[0]}, which is no file of the {PACKAGE} package "
                        f"(a patch for another package?); patches may only change files under {PACKAGE}/")
    return False


def refuse(item: Incoming, files: list[FileDiff], package_path: Callable[[str], str]) -> None:
    """What the applier refuses, refused before anything is written."""
    for entry in files:
        name = f"{PACKAGE}/{package_path(entry.paths[0])}"
        if entry.binary:
            raise UserError(f"{item.label}: {name} is a binary patch; binary patches are refused")
        if entry.symlink:
            raise UserError(f"{item.label}: {name} is a symlink; symlinks are refused")
        for path in entry.paths:
            if path.startswith("/") or ".." in path.split("/"):
                raise UserError(f"{item.label}: {path!r} leaves the package; patches may only change files under "
                                f"{PACKAGE}/")


def check_ids(git: PackageRepo, item: Incoming, files: list[FileDiff], commits: tuple[str, ...],
              package_path: Callable[[str], str]) -> None:
    """An index line's old blob id must be that file's blob in one of `commits`: the baseline (a patch made on the
    pristine package), the stack plus the series' earlier patches, or the baseline plus only those (a series made
    without the stack, which may revert its own change to a file the stack also changes): otherwise the patch was
    made on another build."""
    for entry in files:
        if not entry.old or not entry.old_id or not entry.old_id.strip("0"):
            continue
        path = package_path(entry.old)
        blobs = [blob for commit in (BASELINE_REF, *commits) if (blob := blob_of(git, commit, path))]
        if blobs and not any(blob.startswith(entry.old_id.lower()) for blob in blobs):
            raise UserError(f"{item.label} ({item.subject}): {PACKAGE}/{path} has index {entry.old_id}, but the "
                            f"baseline's blob of that file is {blobs[0][:12]}: the patch was made on another vLLM "
                            "build; import it with --base set to that build, then port it, or pass --ignore-index "
                            "to trust its context")


def blob_of(git: PackageRepo, commit: str, path: str) -> str | None:
    listed = git.run("ls-tree", commit, "--", path).split()
    return listed[2] if len(listed) >= 3 and listed[1] == "blob" else None


def failure(git: PackageRepo, raw: Path, index: Path, strip: str, output: str) -> tuple[str, str]:
    if git.apply_to_index(raw, index, strip, "--check", "-R").ok:
        return "already-applied", "its change is already in the baseline or the stack"
    failed, missing = patchseries.GIT_APPLY_FAILED_AT.search(output), patchseries.GIT_APPLY_MISSING.search(output)
    if missing:
        return "missing-file", f"{PACKAGE}/{missing.group(1)} does not exist in the baseline"
    where = f"{PACKAGE}/{failed.group(1)} at line {failed.group(2)}" if failed else "a hunk"
    if git.apply_to_index(raw, index, strip, "--check", "-C1").ok:
        return "fuzz", f"{where} applies only with fuzz"
    lines = [line for line in output.splitlines() if line.startswith("error:")]
    return "conflict", f"{where} does not apply" if failed or not lines else lines[0].removeprefix("error: ")
