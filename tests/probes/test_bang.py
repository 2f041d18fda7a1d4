"""The corruption probe's judgements on known sequences."""

from __future__ import annotations

import math
import os
from pathlib import Path

from rigstack.client import Reply
from rigstack.probes.bang import first_difference, flags_of
from testing.probes import last_line, run_script


def test_first_difference() -> None:
    assert first_difference([1, 2, 3], [1, 2, 3]) is None
    assert first_difference([1, 2, 3], [1, 9, 3]) == 1
    assert first_difference([1, 2, 3], [1, 2]) == 2


def test_flags_token_zero_and_uniform_logprob() -> None:
    floor = -math.log(154880)  # seed 003: -11.95 on GLM-5.3's vocabulary
    reply = Reply(sent=0.0, ok=True, token_ids=[5, 0, 7, 8], logprobs=[-0.1, -0.2, floor + 0.004, floor + 0.5])
    flags = flags_of(3, reply, floor, tol=0.01)
    assert [(f.run, f.position, f.why.split(" ~")[0]) for f in flags] == [(3, 1, "token id 0"),
                                                                         (3, 2, "logprob -11.946")]
    assert round(floor, 2) == -11.95
    assert flags_of(0, reply, None, 0.01)[0].position == 1 and len(flags_of(0, reply, None, 0.01)) == 1


def test_needs_token_ids(tmp_path: Path, fake_server) -> None:
    process = run_script("probe_bang.py", "run", "--url", fake_server("--no-ids"), "--model", "fake",
                         "--max-tokens", "4", "--repeats", "2", "--out", str(tmp_path / "g"))
    assert process.returncode == 1 and "returned no token ids" in last_line(process)


def test_faulty_server_exits_2(tmp_path: Path, fake_server) -> None:
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "0,1"}
    process = run_script("probe_bang.py", "run", "--url", fake_server("--bad-card", "1", env=env), "--model",
                         "fake", "--max-tokens", "8", "--repeats", "2", "--vocab-size", "1000",
                         "--out", str(tmp_path / "g"))
    assert process.returncode == 2
    assert "note: CORRUPTION SUSPECTED" in last_line(process)
    assert "prompt 0 run 1 position 2: token 0, token id 0" in last_line(process)
