"""conc.py against a server that starts failing mid-sweep: failures are counted per level and reported."""

from __future__ import annotations

import json
from pathlib import Path

from rigstack.client import Reply
from rigstack.probes.conc import _Level, _steady_tok_s
from testing.probes import last_line, run_script


def test_errors_mid_sweep_are_counted(tmp_path: Path, fake_server) -> None:
    """Level 2 measured nothing: the sweep still finishes and writes everything, then exits 4 saying why."""
    url = fake_server("--ok", "5")  # warm-up + the 4 requests of level 1 succeed, then HTTP 500
    process = run_script("conc.py", "--url", url, "--model", "fake", "--levels", "1,2", "--requests", "4",
                         "--fixed", "none", "--out", str(tmp_path / "c"))
    assert process.returncode == 4, process.stderr
    assert "error: every request of c2 failed (HTTP 500: engine dead (fake))" in last_line(process)
    result = json.loads((tmp_path / "c.json").read_text())
    ok, bad = result["rows"]
    assert (ok["concurrency"], ok["ok"], ok["failed"], ok["output_tokens"]) == (1, 4, 0, 16)
    assert (bad["concurrency"], bad["ok"], bad["failed"], bad["output_tokens"]) == (2, 0, 4, 0)
    assert result["metrics"]["c2.failed"]["value"] == 4
    assert "4 failed: HTTP 500: engine dead (fake)" in result["notes"]
    assert "note: 4 failed: HTTP 500: engine dead (fake)" in last_line(process)
    assert (tmp_path / "c.csv").read_text().count("\n") == 3 and (tmp_path / "c.png").stat().st_size > 1000


def test_bad_levels(tmp_path: Path) -> None:
    process = run_script("conc.py", "--url", "http://127.0.0.1:9", "--model", "m", "--levels", "1,two")
    assert process.returncode == 1 and "--levels '1,two': expected comma-separated numbers" in last_line(process)


def _reply(first: float, last: float) -> Reply:
    return Reply(sent=first - 0.1, ok=True, chunk_times=[first, last], done=last)


def test_steady_state_counts_only_intervals_with_every_stream_decoding() -> None:
    level = _Level()
    level.replies = [_reply(1.0, 5.0), _reply(2.0, 6.0)]
    # Counter samples: 10 tok/s while one stream runs, 30 tok/s while both run (t = 2..5).
    level.samples = [(0.0, 0.0), (1.0, 0.0), (2.0, 10.0), (3.0, 40.0), (4.0, 70.0), (5.0, 100.0), (6.0, 110.0)]
    assert _steady_tok_s(level, streams=2) == 30.0
    assert _steady_tok_s(level, streams=3) is None
