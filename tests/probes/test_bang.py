"""The corruption probe's judgements on known sequences."""

from __future__ import annotations

import math
import os
from pathlib import Path

from rigstack.client import Reply
from rigstack.probes.bang import ModelFacts, first_difference, flags_of, model_facts
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
    assert flags_of(0, reply, None, 0.01)[0].position == 1 and len(flags_of(0, reply, None, 0.01)) == 1


def test_token_zero_is_not_flagged_where_it_is_a_special_token() -> None:
    """Issue 29: the tiny model's EOS is id 0 and bang sends ignore_eos, so id 0 is a legitimate answer there; a
    uniform distribution is still the symptom, whatever the token."""
    floor = -math.log(4106)
    reply = Reply(sent=0.0, ok=True, token_ids=[5, 0, 0], logprobs=[-0.1, -2.0, floor + 0.004])
    assert [(f.position, f.why.split(" ~")[0]) for f in flags_of(0, reply, floor, 0.01, frozenset({0, 4}))] == [
        (2, "logprob -8.316")]
    assert [f.position for f in flags_of(0, reply, floor, 0.01, frozenset({4}))] == [1, 2]


def test_model_facts_read_the_special_tokens(tiny_model: Path, tmp_path: Path) -> None:
    facts = model_facts({"root": str(tiny_model)})
    assert facts.vocab_size == 4106
    # eos 0 (config), 0/4/6 (generation_config's stop ids), the tokenizer's special turn markers 1-6; the tool tags
    # (4096 on) are added but not special.
    assert facts.special_ids == frozenset(range(7))
    (tmp_path / "config.json").write_text('{"vocab_size": 10, "eos_token_id": [2, 3], "bos_token_id": 1}')
    assert model_facts({"root": str(tmp_path)}) == ModelFacts(10, frozenset({1, 2, 3}))
    assert model_facts({"root": str(tmp_path / "absent")}).special_ids is None


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
