"""Replacing several files and folders as one (port --write: patches/, versions.env and the port's state): every new
version is staged beside its target first, then a journal commits to the swap, then the renames run. A run killed
before the journal leaves only staging behind (the tree is wholly old); one killed after it is finished by the next
reader (load_stack, load_pins, every port step), so the tree is wholly new. Nobody ever reads half of each.

A folder cannot be renamed over a non-empty one, so a folder moves aside (NAME.swap-old) and the new one takes its
place; the journal covers that gap too."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

from rigstack.atomic import write_atomic
from rigstack.errors import UserError

JOURNAL = ".rigstack-swap.json"
STAGED, ASIDE = ".swap-new", ".swap-old"
# Tests stop a swap after a named step (a kill -9 at that point, as a user's Ctrl-\ or an OOM would), then check
# the next command finds the tree wholly old or wholly new.
STOP_AFTER = "RIGSTACK_SWAP_STOP_AFTER"


def staged(target: Path) -> Path:
    """Where a target's new version is staged: beside it, on the same file system."""
    return target.with_name(target.name + STAGED)


def swap(targets: list[Path]) -> None:
    """Replace every target by its staged version (see staged()), all or nothing. The journal lives in the first
    target's folder, where load_stack and load_pins look for it."""
    for target in targets:
        if not staged(target).exists():
            raise AssertionError(f"{staged(target)} was not staged")
    _stop_here("staged")
    journal = targets[0].parent / JOURNAL
    write_atomic(journal, json.dumps({"targets": [str(target.absolute()) for target in targets]}).encode())
    _stop_here("journal")
    _roll_forward(journal)


def discard(targets: list[Path]) -> None:
    """Remove what a swap that never reached its journal staged."""
    for target in targets:
        _remove(staged(target))


def recover(folder: Path) -> list[str]:
    """Finish a swap a killed run left in `folder`; returns the targets it put in place (empty when none was open)."""
    journal = folder / JOURNAL
    if not journal.is_file():
        return []
    return _roll_forward(journal)


def _roll_forward(journal: Path) -> list[str]:
    try:
        targets = [Path(name) for name in json.loads(journal.read_text())["targets"]]
    except (OSError, ValueError, KeyError, TypeError) as error:
        raise UserError(f"{journal} cannot be read ({error}); a port --write was interrupted: check patches/ and "
                        "versions.env with `git status`, then remove the file") from None
    for number, target in enumerate(targets, start=1):
        new, old = staged(target), target.with_name(target.name + ASIDE)
        if new.is_dir():
            if target.exists() and not old.exists():
                os.rename(target, old)
                _stop_here(f"aside-{number}")
            os.rename(new, target)
        elif new.exists():
            os.replace(new, target)
        _stop_here(f"moved-{number}")
        _remove(old)
    journal.unlink()
    return [str(target) for target in targets]


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    else:
        path.unlink(missing_ok=True)


def _stop_here(step: str) -> None:
    if os.environ.get(STOP_AFTER) == step:
        os._exit(137)
