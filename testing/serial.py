"""Test files that must not run beside each other on one box, whatever xdist does with them.

The fleet, replicas and two-namespace files each boot several servers of about 2.5 GiB; run side by side on the two
workers of `make test` one could starve the other of RAM (issue 37 item 3). The patch proof runs some 35 pytest
processes one after another for nine minutes; beside it the fleet and replicas files' timing (a router's health
checks, a replica's running gauge read between requests) failed for the first time in a CI run, the proof taking
one core the whole while. A file takes the lock for its whole module; another file asking for the same lock waits.
"""

from __future__ import annotations

import fcntl
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

MEMORY_HUNGRY = "memory-hungry"


@contextmanager
def alone(name: str) -> Iterator[None]:
    """Hold the lock `name` for the block: one holder at a time on this box, across processes."""
    path = Path(tempfile.gettempdir()) / f"rigstack-tests-{name}.lock"
    with open(path, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


@pytest.fixture(scope="module")
def memory_hungry() -> Iterator[None]:
    """For a module's `pytestmark = pytest.mark.usefixtures("memory_hungry")`: the file runs alone among such files."""
    with alone(MEMORY_HUNGRY):
        yield


@pytest.fixture(scope="module")
def cpu_hungry() -> Iterator[None]:
    """The same lock for a file that takes a core for minutes (the patch proof): not beside the server files."""
    with alone(MEMORY_HUNGRY):
        yield
