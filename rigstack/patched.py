"""A package rigstack patched, read back from its git history: what is applied (status), the patch files
regenerated from its commits (export), the combined diff against the baseline, the files the stack laid.
"""

from __future__ import annotations

import os
from pathlib import Path

from rigstack import compiled, history
from rigstack.atomic import write_atomic
from rigstack.errors import UserError
from rigstack.gitrepo import PackageRepo
from rigstack.history import TRAILER, trailers
from rigstack.invocation import command
from rigstack.stack import SEPARATOR
from rigstack.stamp import STAMP_NAME
from rigstack.versions import Pins, load_pins


def _patched_repo(package: Path, pins: Pins | None = None) -> tuple[PackageRepo, history.Checked]:
    """The package's git history and its stamp as that history has it (rebuilt from it when the file disagrees)."""
    repo = PackageRepo(Path(os.path.realpath(package)))
    checked = history.check(repo, pins) if repo.exists else None
    if checked is None:
        raise UserError(f"{package} was not patched by rigstack (no history in {repo.git_dir}); "
                        f"run `{command(f'apply --from dir:{package}')}`")
    return repo, checked


def status(package: Path, pins: Pins | None = None) -> dict:
    """What is applied to a package, from its git history; the stamp is checked against it and the pins as apply
    checks it, and shown rebuilt from the history when they disagree."""
    pins = pins or load_pins()
    repo, checked = _patched_repo(package, pins)
    stamp = checked.stamp
    commits = {done.file: commit for commit, done in checked.applied}
    manifest, wrong = compiled.check(repo, pins, stamp.flavour)
    return {
        "package": str(package), "vllm_version": stamp.vllm_version, "flavour": stamp.flavour,
        "source": stamp.source, "stack_hash": stamp.stack_hash, "baseline_fingerprint": stamp.baseline_fingerprint,
        "stamp_matches_history": checked.wrong is None,
        "stamp_disagrees_on": checked.wrong,
        "dirty_files": repo.dirty_files(),
        "compiled_changed": wrong,  # path -> changed | missing
        "compiled_checked_against": manifest.reference,
        "patches": [{"id": p.id, "file": p.file, "status": p.status, "commit": commits.get(p.file, "")}
                    for p in stamp.patches],
    }


def export(package: Path, to: Path) -> list[Path]:
    """Regenerate the patch files from the package's commits (header from the message, diff from git).

    A patch whose change the baseline already held (already-applied) made a commit with no diff: there is nothing to
    regenerate it from. The others are written, then an error names the ones left out, so a script that replaces
    patches/ with the export stops before it loses them."""
    repo, checked = _patched_repo(package)
    to.mkdir(parents=True, exist_ok=True)
    written, left_out = [], []
    commits = repo.log(checked.baseline, checked.head)
    for commit, message in commits:
        trailer = trailers(message)
        header = message[message.index("\n\n") + 2: message.rindex("\n" + TRAILER)]
        diff = repo.diff(commit + "^", commit, renames=True)  # an imported rename stays one, as it was written
        if not diff:
            left_out.append(trailer["Rigstack-Patch"])
            continue
        written.append(write_atomic(to / trailer["Rigstack-Patch"], header + SEPARATOR + diff))
    if left_out:
        raise UserError(f"{to}: wrote {len(written)} of {len(commits)} patch files; left out {', '.join(left_out)}: "
                        "the baseline already held their change (already-applied), so their commits hold no diff "
                        "to export. Keep the original patch files as they are")
    return written


def combined_diff(package: Path) -> str:
    repo, checked = _patched_repo(package)
    return repo.diff(checked.baseline, checked.head)


def laid_files(package: Path) -> list[str]:
    """Package-relative files the stack added or changed, plus the stamp: what an image lays over its base."""
    repo, checked = _patched_repo(package)
    return repo.changed_files(checked.baseline, checked.head) + [STAMP_NAME]
