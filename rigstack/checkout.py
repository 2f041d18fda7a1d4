"""The one step that writes a patched package: git checks out the new commit over the old, with a journal beside it
(rigstack.journal) so the next run finishes an interrupted one; what it needs (disk room, writable folders) is
checked first, so it is not met half way through.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from rigstack import history, journal
from rigstack.errors import UserError
from rigstack.gitrepo import PackageRepo
from rigstack.journal import Journal
from rigstack.stamp import Stamp


def check_free(folder: Path, needed: int) -> None:
    free = shutil.disk_usage(folder).free
    if free < needed:
        raise UserError(f"{folder} has {free / 1e6:.0f} MB free but this apply needs {needed / 1e6:.0f} MB; free "
                        f"{(needed - free) / 1e6:.0f} MB or pass another --out; nothing was changed")


def checkout(repo: PackageRepo, old: str, new: str, stamp: Stamp) -> None:
    """The one step that writes the package; a journal beside it lets the next run finish an interrupted one."""
    changed = repo.changed_files(old, new)
    # What the checkout writes, plus room for the index it rewrites and the stamp.
    check_free(repo.package, repo.blob_sizes(new, changed) + 2 * _size(repo.git_dir / "index") + (1 << 20))
    _refuse_unwritable_folders(repo, list(repo.changed_blobs(old, new)))
    state = repo.git_dir.parent
    journal.write_journal(state, Journal(before=old, target=new, stamp=stamp))
    repo.checkout(old, new)
    history.record(repo, stamp)
    journal.remove_journal(state)


def _refuse_unwritable_folders(repo: PackageRepo, paths: list[str]) -> None:
    """git writes each file by replacing it in its folder: a read-only one (a bind mount, a mode) is named before
    the journal, not met half way through."""
    folders = {(repo.package / path).parent for path in paths}
    for folder in sorted(folders):
        existing = next(path for path in (folder, *folder.parents) if path.exists())
        if not os.access(existing, os.W_OK):
            raise UserError(f"{existing} is not writable, and the stack changes files in it; make it writable and "
                            "rerun; nothing was changed")


def _size(path: Path) -> int:
    return path.stat().st_size if path.is_file() else 0
