"""What every timed probe shares: request parameters, per-request timings, server counters, prompt sets."""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any, Literal

import httpx

from rigstack.client import START_HINT, Reply, Server, parse_prometheus
from rigstack.errors import UserError

DATA_DIR = Path(__file__).resolve().parent / "data"
FixedLength = Literal["auto", "ignore_eos", "min_tokens", "none"]
FIXED_CHOICES = ("auto", "ignore_eos", "min_tokens", "none")

# vLLM's counter names (prometheus adds _total to counters).
GENERATION_TOKENS = "vllm:generation_tokens_total"
SPEC_DRAFTS = "vllm:spec_decode_num_drafts_total"
SPEC_DRAFT_TOKENS = "vllm:spec_decode_num_draft_tokens_total"
SPEC_ACCEPTED = "vllm:spec_decode_num_accepted_tokens_total"


@cache
def workloads() -> dict[str, list[str]]:
    raw = json.loads((DATA_DIR / "workloads.json").read_text())
    return {name: prompts for name, prompts in raw.items() if not name.startswith("_")}


def workload_prompts(names: list[str]) -> dict[str, list[str]]:
    known = workloads()
    unknown = [name for name in names if name not in known]
    if unknown:
        raise UserError(f"unknown workload {', '.join(unknown)}; use one of: {', '.join(known)}")
    return {name: known[name] for name in names}


def chat_payload(prompt: str, max_tokens: int, fixed: FixedLength, **extra: Any) -> dict[str, Any]:
    """A greedy streamed chat request whose output length is pinned by `fixed` (ignore_eos or min_tokens)."""
    payload: dict[str, Any] = {"messages": [{"role": "user", "content": prompt}], "max_tokens": max_tokens,
                               "temperature": 0.0, "stream": True, "stream_options": {"include_usage": True}}
    if fixed == "ignore_eos":
        payload["ignore_eos"] = True
    elif fixed == "min_tokens":
        payload["min_tokens"] = max_tokens
    return {**payload, **extra}


def request_params(payload: dict[str, Any]) -> dict[str, Any]:
    """The payload as provenance: everything but the prompt text."""
    return {key: value for key, value in payload.items() if key not in ("messages", "prompt")}


async def resolve_fixed_length(server: Server, session: httpx.AsyncClient, fixed: FixedLength) -> FixedLength:
    """"auto": ignore_eos where the server accepts it (vLLM), else min_tokens, else nothing."""
    if fixed not in FIXED_CHOICES:
        raise UserError(f"--fixed {fixed!r}: use one of {', '.join(FIXED_CHOICES)}")
    if fixed != "auto":
        return fixed
    for choice in ("ignore_eos", "min_tokens"):
        payload = chat_payload("hi", 2, choice)  # type: ignore[arg-type]
        reply = await server.request(session, "/v1/chat/completions", payload)
        if reply.ok:
            return choice  # type: ignore[return-value]
        if reply.status is None:
            raise UserError(f"cannot reach {server.endpoint.base}: {reply.error}; {START_HINT}")
    return "none"


@dataclass(frozen=True)
class Timing:
    """One request's numbers, in seconds; None where the request gave too little to say."""

    ok: bool
    error: str | None
    tokens: int
    prompt_tokens: int | None
    ttft: float | None
    e2e: float | None
    tpot: float | None  # decode time per output token, first token excluded (as vLLM's bench does)
    itl: tuple[float, ...]  # gaps between output chunks (a chunk may carry several tokens)
    decode_s: float | None  # first output chunk to last

    @property
    def decode_tok_s(self) -> float | None:
        if not self.decode_s or self.tokens < 2:
            return None
        return (self.tokens - 1) / self.decode_s


def timing(reply: Reply) -> Timing:
    times = reply.chunk_times
    decode_s = times[-1] - times[0] if len(times) > 1 else None
    tokens = reply.tokens if reply.ok else 0
    tpot = (reply.e2e - reply.ttft) / (tokens - 1) if reply.ok and tokens > 1 and reply.ttft is not None else None
    return Timing(ok=reply.ok, error=reply.error, tokens=tokens, prompt_tokens=reply.prompt_tokens,
                  ttft=reply.ttft if reply.ok else None, e2e=reply.e2e if reply.ok else None, tpot=tpot,
                  itl=tuple(b - a for a, b in zip(times, times[1:])) if reply.ok else (),
                  decode_s=decode_s if reply.ok else None)


async def scrape(session: httpx.AsyncClient) -> dict[str, float] | None:
    """The server's counters now, or None when it has no /metrics (or it failed: counters are optional)."""
    try:
        response = await session.get("/metrics")
    except httpx.TransportError:
        return None
    return parse_prometheus(response.text) if response.status_code == 200 else None


def delta(before: dict[str, float] | None, after: dict[str, float] | None, name: str) -> float | None:
    if before is None or after is None or name not in after:
        return None
    return after[name] - before.get(name, 0.0)


def spec_acceptance(before: dict[str, float] | None, after: dict[str, float] | None) -> dict[str, float | None]:
    """Speculative decoding over an interval: accepted/drafted tokens and mean tokens per verify step."""
    drafts = delta(before, after, SPEC_DRAFTS)
    drafted = delta(before, after, SPEC_DRAFT_TOKENS)
    accepted = delta(before, after, SPEC_ACCEPTED)
    if not drafts or drafted is None or accepted is None:
        return {"spec_acceptance_rate": None, "spec_mean_accepted_len": None}
    return {"spec_acceptance_rate": accepted / drafted if drafted else None,
            "spec_mean_accepted_len": 1.0 + accepted / drafts}
