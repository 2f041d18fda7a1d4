"""Reading what patches 0003 and 0012's stage timer writes: its log lines and its Chrome trace."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

LINE = re.compile(r"stage_timing pp_rank=(\d+) step=(\d+) tokens=(\d+) ms=(\d+\.\d+)")


def timing_lines(caplog: pytest.LogCaptureFixture) -> list[tuple[int, int, int, float]]:
    """(pp_rank, step, tokens, ms) of every stage_timing line logged."""
    found = [LINE.search(record.getMessage()) for record in caplog.records]
    return [(int(m[1]), int(m[2]), int(m[3]), float(m[4])) for m in found if m]


def trace_events(path: Path) -> list[dict[str, Any]]:
    """The trace file as a consumer reads it: a JSON array whose closing bracket may be missing."""
    text = path.read_text()
    assert text.startswith("[\n")
    return json.loads(text.rstrip().rstrip(",") + "]")
