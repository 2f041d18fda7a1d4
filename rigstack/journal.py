"""The journal of the one step that writes a package (the checkout), and the next run's recovery from a killed one.

Before the checkout starts, the journal records the commit the package holds and the one it is going to, with the
stamp that goes with it; it is removed once that stamp is written. It is written atomically, so a run killed while
writing it leaves no journal at all; one that cannot be read anyway is not trusted: its checkout never started, and
the package is what its history and stamp say."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from rigstack.atomic import temp_glob, write_atomic
from rigstack.errors import UserError
from rigstack.gitrepo import PackageRepo
from rigstack.history import record
from rigstack.stamp import Stamp

JOURNAL = "applying.json"


@dataclass(frozen=True)
class Journal:
    before: str  # the commit the package held when the checkout started
    target: str  # the commit it was going to
    stamp: Stamp


def journal_path(state: Path) -> Path:
    return state / JOURNAL


def write_journal(state: Path, entry: Journal) -> None:
    write_atomic(journal_path(state), json.dumps({"before": entry.before, "target": entry.target,
                                                  "stamp": entry.stamp.to_dict()}))


def remove_journal(state: Path) -> None:
    journal_path(state).unlink()


def leftover_temporaries(state: Path) -> list[Path]:
    """Journals a killed run was still writing (never renamed into place, so never trusted)."""
    return sorted(state.glob(temp_glob(journal_path(state)))) if state.is_dir() else []


def recover(repo: PackageRepo) -> tuple[str, ...]:
    """Finish the checkout a killed run left, unless files in the package differ from both ends of it."""
    state = repo.git_dir.parent
    path = journal_path(state)
    if not path.is_file():
        return ()
    entry = _read(path, repo)
    if entry is None:
        path.unlink()
        return (f"removed an unreadable journal ({path.name}) of a run killed before its checkout started; the "
                "package is as its history says",)
    edited, short = _unexplained(repo, entry.before, entry.target)
    if edited:
        more = f" and {len(edited) - 1} more" if len(edited) > 1 else ""
        undo = f"git -C {repo.package} --git-dir={repo.git_dir} --work-tree=. checkout {entry.target[:12]} --"
        raise UserError(f"{repo.package}: a killed apply left its checkout unfinished, and {edited[0]}{more} "
                        "differ from both the package before it and after it; nothing was touched. Copy your "
                        f"changes elsewhere, then undo them (`{undo} {' '.join(edited)}`) and rerun to finish the "
                        "apply")
    repo.reset_hard(entry.target)
    record(repo, entry.stamp)
    path.unlink()
    rewrote = (f" (rewrote {', '.join(short)}: missing or cut short, as a checkout killed mid-write leaves a file, "
               "and as an emptied one looks)" if short else "")
    return (f"recovered an interrupted apply: the package now holds {entry.target[:12]}{rewrote}",)


def _read(path: Path, repo: PackageRepo) -> Journal | None:
    """The journal, or None when it is not one this tool wrote whole (torn, empty, hand-edited, or naming a commit
    the history does not have)."""
    try:
        data = json.loads(path.read_bytes())
        stamp = Stamp.from_dict(data["stamp"])
        target = data["target"]
        # A journal of a tool that did not record `before` was written when the branch still held it.
        before = data.get("before") or repo.rev("HEAD")
    except (ValueError, TypeError, KeyError, AttributeError):
        return None
    if not (isinstance(target, str) and isinstance(before, str) and repo.rev(target) and repo.rev(before)):
        return None
    return Journal(before, target, stamp)


def _unexplained(repo: PackageRepo, before: str, target: str) -> tuple[list[str], list[str]]:
    """Package files an interrupted checkout from `before` to `target` cannot explain (not what either commit holds),
    and the checkout's files it left missing or short.

    git writes a file by unlinking it, then writing it from the start, so a kill can leave a file the checkout writes
    missing or holding the first bytes of the target's. Those are the checkout's own, and the recovery finishes
    them; a file the user emptied or deleted there looks the same and is finished too (the note names each)."""
    ends = repo.changed_blobs(before, target)
    edited = [path for path in repo.modified_files() if path not in ends]
    present = [path for path in ends if (repo.package / path).is_file()]
    found = repo.work_blobs(present)
    short = []
    for path, (old, new) in ends.items():
        blob = found.get(path)
        if blob in (old, new) and blob is not None:
            continue
        if new is not None and (blob is None or repo.blob_bytes(new).startswith((repo.package / path).read_bytes())):
            short.append(path)
        elif blob is not None:
            edited.append(path)
    return sorted(edited), sorted(short)
