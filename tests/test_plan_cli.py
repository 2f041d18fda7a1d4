"""`rigstack plan` refuses what it cannot plan or write in one line, exit 1, before or without a traceback (issue 39
item 12: a chart path it could not write and a suffix matplotlib lacks were `bug:` crashes; TP 3 and TP 1,000,000
were planned although vLLM refuses a TP that does not divide the attention heads)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from rigstack.versions import REPO_ROOT


def _plan(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "rigstack", "plan", "--profile", "cpu-tiny", *args], cwd=REPO_ROOT,
                          capture_output=True, text=True, timeout=600, env={**os.environ, "COLUMNS": "400"})


@pytest.mark.parametrize(("args", "expected"), [
    (("--png", "FOLDER"), "is a folder; give the chart's file path"),
    (("--png", "FOLDER/plan.xyz"), "matplotlib writes no .xyz chart; end the name in one of "),
    (("--png", "/proc/plan.png"), "cannot write the chart /proc/plan.png"),  # /proc takes no new file, for root too
    (("--tp", "3", "--png", "FOLDER/p.png"), "TP3 does not divide the model's 4 attention heads (vLLM refuses it); "
                                            "give --tp one of 1, 2, 4"),
    (("--tp", "1000000", "--png", "FOLDER/p.png"), "TP1000000 does not divide the model's 4 attention heads"),
])
def test_what_cannot_be_planned_or_written_is_one_line(tmp_path: Path, args: tuple[str, ...], expected: str) -> None:
    done = _plan(*(arg.replace("FOLDER", str(tmp_path)) for arg in args))
    errors = [line for line in done.stderr.splitlines() if line.startswith(("error:", "bug:"))]
    assert done.returncode == 1 and len(errors) == 1 and expected in errors[0], done.stderr[-2000:]
    assert not list(tmp_path.iterdir())
