"""What was started, as a record in its run folder (<run_dir>/server.json) that a later `stop` finds; its log."""

from __future__ import annotations

import json
import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from rigstack.atomic import write_atomic
from rigstack.cache import cache_dir
from rigstack.errors import UserError

RECORD_NAME = "server.json"
LOG_NAME = "server.log"
TAIL_LINES = 40
DEFAULT_RUN_DIR = cache_dir() / "run"


@dataclass(frozen=True)
class RunRecord:
    """What rigstack.serving.process.start() started; written to <run_dir>/server.json."""

    pid: int
    pgid: int
    start_ticks: int  # /proc start time, so a recycled pid is never mistaken for our server
    argv: list[str]
    env: dict[str, str]
    log: str
    url: str
    served_name: str
    container: str | None = None
    started_at: float = field(default_factory=time.time)
    profile: str | None = None  # the profile it serves, so a probe's result can name it (None: started by hand)


def read_record(run_dir: Path) -> RunRecord | None:
    path = run_dir / RECORD_NAME
    if not path.is_file():
        return None
    try:
        return RunRecord(**json.loads(path.read_text()))
    except (ValueError, TypeError):
        raise UserError(f"{path}: unreadable run record; remove it (`rm {path}`) after checking no server "
                        "from it still runs") from None


def write_record(run_dir: Path, record: RunRecord) -> None:
    write_atomic(run_dir / RECORD_NAME, json.dumps(asdict(record), indent=2) + "\n")


def log_tail(path: Path, lines: int = TAIL_LINES) -> str:
    if not path.is_file():
        return ""
    with path.open("rb") as log:
        log.seek(0, os.SEEK_END)
        log.seek(max(0, log.tell() - 256 * 1024))
        return "\n".join(log.read().decode(errors="replace").splitlines()[-lines:])
