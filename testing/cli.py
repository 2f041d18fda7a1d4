"""apply.py as a user runs it: a real process, its exit code and its one-line error."""

from __future__ import annotations

import os
import subprocess
import sys

from rigstack.versions import REPO_ROOT


def run_apply(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(REPO_ROOT / "apply.py"), *args], capture_output=True, text=True,
                          env={**os.environ, "COLUMNS": "200", **(env or {})}, cwd=REPO_ROOT)


def one_line_error(result: subprocess.CompletedProcess) -> str:
    lines = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(lines) == 1, result.stderr
    assert "Traceback" not in result.stderr
    return lines[0]
