"""What a launch reports while it runs, as events to the on_event callable the command passes in: nothing in the
serving layer writes to the terminal; rigstack/output/launch.py renders them. The default, quiet, reports nothing."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from rigstack.serving.runrecord import RunRecord


@dataclass(frozen=True)
class WaitStarted:
    record: RunRecord


@dataclass(frozen=True)
class Waiting:
    """One poll of the staged wait: the stage not passed yet and the server log's newest line."""

    stage: str
    log_line: str


@dataclass(frozen=True)
class StagePassed:
    stage: str
    after_s: float


@dataclass(frozen=True)
class WaitEnded:
    """The wait is over, passed or not (a live display of it can go)."""

    record: RunRecord


@dataclass(frozen=True)
class Died:
    """The server exited during the wait: the last lines of its log."""

    log: str
    tail: str


@dataclass(frozen=True)
class Killing:
    """The group outlived SIGTERM's grace period and gets SIGKILL."""

    pgid: int
    grace_s: float


@dataclass(frozen=True)
class DryRun:
    """--dry-run: the launch as shell commands, nothing started."""

    commands: str


@dataclass(frozen=True)
class Forced:
    """Preflight failed and --force starts anyway."""


@dataclass(frozen=True)
class Ready:
    url: str
    served_name: str
    record: RunRecord


@dataclass(frozen=True)
class Serving:
    """Everything answers; how to stop it."""

    stop_hint: str


@dataclass(frozen=True)
class Stopped:
    count: int
    run_dir: Path


Event = WaitStarted | Waiting | StagePassed | WaitEnded | Died | Killing | DryRun | Forced | Ready | Serving | Stopped
OnEvent = Callable[[Event], None]


def quiet(event: Event) -> None:
    """The default on_event: library callers and tests that watch nothing."""
