"""expert-trace from the command line against a server that answers patch 0014's count table (the fake server's
--counts): bad input and bad answers are one line naming the thing and what to do, exit 1, and nothing written
(issue 39 items 6 and 12: each case below crashed with a traceback or blocked before)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from testing.probes import last_line, run_script

GOOD = {"format": "rigstack-hot-experts/1", "expert_bytes": 1 << 20, "model": {"experts": 4},
        "counts": {"layers.0": [4, 3, 2, 1]}}


def _trace(url: str, *args: str) -> tuple[int, str]:
    process = run_script("expert_trace.py", "--url", url, "--model", "fake", *args, timeout=120,
                         env={**os.environ, "COLUMNS": "400"})
    return process.returncode, last_line(process)


@pytest.mark.parametrize(("args", "expected"), [
    (("--timeout", "nan"), "--timeout nan: give the seconds a request may take, above 0"),
    (("--timeout", "-5"), "--timeout -5: give the seconds a request may take, above 0"),
    (("--budget-gib", "nan"), "--budget-gib nan: give the device GiB for the caches, above 0 and at most 1,048,576"),
    (("--budget-gib", "1e300"), "--budget-gib 1e+300: give the device GiB for the caches"),
    (("--cache", "2", "--prompts", "/dev/zero"), "prompt file /dev/zero: a character device, not a regular file"),
    (("--cache", "2", "--prompts", "/nonexistent"), "prompt file /nonexistent: does not exist"),
    (("--cache", "2", "--prompts", "FOLDER"), "a directory, not a regular file; give a text file"),
    (("--cache", "2", "--prompts", "NOT_UTF8"), "not UTF-8 text (byte 0xff at column 1); save the file as UTF-8"),
    (("--cache", "2", "--prompts", "FIFO"), "a FIFO (named pipe), not a regular file"),
    (("--cache", "2", "--out", "FOLDER"), "is a folder; give the hot-set file's path"),
    # /proc takes no new file, for root too: a read-only place on every box
    (("--cache", "2", "--out", "/proc/hot.json"), "cannot write the hot-set file /proc/hot.json"),
])
def test_bad_arguments_are_one_line(tmp_path: Path, fake_server, args: tuple[str, ...], expected: str) -> None:
    (tmp_path / "bytes.txt").write_bytes(b"\xff\xfe\n")
    os.mkfifo(tmp_path / "fifo")
    places = {"FOLDER": str(tmp_path), "NOT_UTF8": str(tmp_path / "bytes.txt"), "FIFO": str(tmp_path / "fifo")}
    code, line = _trace(fake_server("--counts"), *(places.get(arg, arg) for arg in args))
    assert code == 1 and "error: " in line and expected in line.split("error: ", 1)[1], line


@pytest.mark.parametrize(("table", "expected"), [
    ({**GOOD, "counts": {"layers.0": ["x", 1, 2, 3]}}, "not lists of pick counts"),
    ({**GOOD, "counts": {"layers.0": [-1, 1, 2, 3]}}, "not lists of pick counts"),
    ({**GOOD, "counts": {"layers.0": 7}}, "not lists of pick counts"),
    ({**GOOD, "counts": {"layers.0": []}}, "not lists of pick counts"),
    ({**GOOD, "counts": {}}, "not lists of pick counts"),
    ({**GOOD, "expert_bytes": 0}, "gives 0 bytes an expert"),
])
def test_a_malformed_count_table_is_refused(tmp_path: Path, fake_server, table: dict, expected: str) -> None:
    out = tmp_path / "hot.json"
    code, line = _trace(fake_server("--counts", "--table", json.dumps(table)), "--cache", "1", "--out", str(out))
    assert code == 1 and expected in line and "is the stack's patch 0014 applied?" in line, line
    assert not out.exists()
