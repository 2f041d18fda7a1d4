"""Real mounts for tests (a small file system, a second path to a folder, a read-only folder): they need root, as in
CI; a test skips where the kernel refuses them."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest


@contextmanager
def mounted(target: Path, *args: str) -> Iterator[Path]:
    """`mount ARGS TARGET` for the block, unmounted after it."""
    target.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(["mount", *args, str(target)], capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount here: {done.stderr.strip()}")
    try:
        yield target
    finally:
        subprocess.run(["umount", str(target)], check=True)


@contextmanager
def read_only(folder: Path) -> Iterator[Path]:
    """The folder read-only for the block: a read-only bind mount onto itself where mounting is allowed; else, for a
    user the modes bind (root's writes ignore them), its write bits taken away."""
    probe = subprocess.run(["mount", "--bind", "-o", "ro", str(folder), str(folder)], capture_output=True, text=True)
    if probe.returncode == 0:
        try:
            yield folder
        finally:
            subprocess.run(["umount", str(folder)], check=True)
        return
    if os.geteuid() == 0:
        pytest.skip(f"cannot bind-mount here, and modes do not bind root: {probe.stderr.strip()}")
    mode = folder.stat().st_mode
    folder.chmod(mode & ~0o222)
    try:
        assert not os.access(folder, os.W_OK), "this user can still write there"
        yield folder
    finally:
        folder.chmod(mode)
