"""What was started, as a record in its run folder (<run_dir>/server.json) that a later `stop` finds; its log."""

from __future__ import annotations

import json
import os
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

from rigstack.atomic import write_atomic
from rigstack.cache import cache_dir
from rigstack.endpoint import REDACTED
from rigstack.errors import UserError

RECORD_NAME = "server.json"
LOG_NAME = "server.log"
TAIL_LINES = 40
DEFAULT_RUN_DIR = cache_dir() / "run"
# A variable named with one of these words holds a credential (TOKENIZERS_PARALLELISM does not: words, not text).
_SECRET_WORDS = {"TOKEN", "KEY", "SECRET", "PASSWORD", "PASSWD", "CREDENTIALS"}


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
        record = RunRecord(**json.loads(path.read_text()))
    except (ValueError, TypeError, RecursionError):
        record = None
    if record is None or not _well_typed(record):  # an edited "pid": "123" would reach os.kill as text
        raise UserError(f"{path}: unreadable run record; remove it (`rm {path}`) after checking no server "
                        "from it still runs")
    return record


def _well_typed(record: RunRecord) -> bool:
    def whole(value: object) -> bool:
        return isinstance(value, int) and not isinstance(value, bool)

    return (whole(record.pid) and whole(record.pgid) and whole(record.start_ticks)
            and isinstance(record.argv, list) and all(isinstance(arg, str) for arg in record.argv)
            and isinstance(record.env, dict) and all(isinstance(v, str) for v in record.env.values())
            and all(isinstance(text, str) for text in (record.log, record.url, record.served_name))
            and isinstance(record.container, (str, type(None))) and isinstance(record.profile, (str, type(None)))
            and isinstance(record.started_at, (int, float)) and not isinstance(record.started_at, bool))


def write_record(run_dir: Path, record: RunRecord) -> None:
    """The record, owner-only, its secret-named variables (HF_TOKEN, VLLM_API_KEY, ...) blanked: nothing that reads
    it back (stop, the probes' package lookup) needs their values."""
    env = {name: REDACTED if _SECRET_WORDS & set(name.upper().split("_")) else value
           for name, value in record.env.items()}
    write_atomic(run_dir / RECORD_NAME, json.dumps(asdict(replace(record, env=env)), indent=2) + "\n", private=True)


def log_tail(path: Path, lines: int = TAIL_LINES) -> str:
    if not path.is_file():
        return ""
    with path.open("rb") as log:
        log.seek(0, os.SEEK_END)
        log.seek(max(0, log.tell() - 256 * 1024))
        return "\n".join(log.read().decode(errors="replace").splitlines()[-lines:])
