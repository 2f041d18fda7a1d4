"""What every timed probe shares: request parameters, per-request timings, server counters, prompt sets."""

from __future__ import annotations

import json
import statistics
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any, Literal

import httpx

from rigstack.client import START_HINT, Reply, Server
from rigstack.errors import UserError

DATA_DIR = Path(__file__).resolve().parent / "data"
FixedLength = Literal["auto", "ignore_eos", "min_tokens", "none"]
FIXED_CHOICES = ("auto", "ignore_eos", "min_tokens", "none")

# vLLM's counter names (prometheus adds _total to counters).
GENERATION_TOKENS = "vllm:generation_tokens_total"
SPEC_DRAFTS = "vllm:spec_decode_num_drafts_total"
SPEC_DRAFT_TOKENS = "vllm:spec_decode_num_draft_tokens_total"
SPEC_ACCEPTED = "vllm:spec_decode_num_accepted_tokens_total"
# vLLM's timing histograms (each exports NAME_sum and NAME_count). The inter-token latency is taken on the engine's
# clock, one observation per engine step of a request, so its mean is the server's own step time.
STEP = "vllm:inter_token_latency_seconds"
TPOT = "vllm:request_time_per_output_token_seconds"
DECODE = "vllm:request_decode_time_seconds"
TTFT = "vllm:time_to_first_token_seconds"

# A client-side time is a measurement only when it agrees with the server's own clock. "Far below the server's
# step" is a tenth of it: chunks that close together were held and flushed at once (the tiny CPU server sends
# 246 chunks within 23 ms after about 1 s), so client-side decode rates and gaps would divide by almost nothing.
BURST_FRACTION = 0.1
AGREE_WITHIN = 0.25  # relative difference up to which a client rate and the server's agree


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
        if reply.unreachable:
            raise UserError(f"cannot reach {server.endpoint.base}: {reply.error}; {START_HINT}")
        if reply.status is None:  # it took the request and then went silent, or broke off: up, but not answering
            raise UserError(f"{server.endpoint.base} took the request but gave no answer: {reply.error}; is it "
                            "overloaded or stuck? Raise --timeout, or restart it")
    return "none"


def max_model_len(card: dict[str, Any]) -> int | None:
    """The context the server serves, from its /v1/models card (vLLM puts it there), None when it does not say."""
    value = card.get("max_model_len")
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def check_fits(server: Server, card: dict[str, Any], max_tokens: int, bodies: list[dict[str, Any]]) -> None:
    """Up front, before anything is timed: a request that cannot fit the server's context only comes back as
    HTTP 400. bodies are the requests (messages and tools, or a prompt); the server's tokenizer counts them."""
    limit = max_model_len(card)
    if limit is None:
        return
    counts = [server.chat_tokens(body["messages"], body.get("tools")) if "messages" in body
              else server.tokenize(body["prompt"], special=True) for body in bodies]
    prompt = max((count or 0 for count in counts), default=0)
    if max_tokens + prompt <= limit:
        return
    room = limit - prompt
    fix = (f"pass --max-tokens {room} or less" if room > 0
           else "use a shorter prompt, or a server started with a larger --max-model-len")
    raise UserError(f"--max-tokens {max_tokens} does not fit the server: its max_model_len is {limit} and the "
                    f"longest prompt takes {prompt} tokens; {fix}")


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


def decode_rate(timings: list[Timing]) -> float | None:
    """Decoded tokens (each request's first excluded) over decoding time, summed over the requests: the server's
    own definition, so the two compare like for like (a mean of per-request rates would favour short bursts)."""
    spans = [t for t in timings if t.ok and t.decode_s and t.tokens > 1]
    seconds = sum(t.decode_s or 0.0 for t in spans)
    return sum(t.tokens - 1 for t in spans) / seconds if seconds else None


def timing(reply: Reply) -> Timing:
    times = reply.chunk_times
    decode_s = times[-1] - times[0] if len(times) > 1 else None
    tokens = reply.tokens if reply.ok else 0
    tpot = (reply.e2e - reply.ttft) / (tokens - 1) if reply.ok and tokens > 1 and reply.ttft is not None else None
    return Timing(ok=reply.ok, error=reply.error, tokens=tokens, prompt_tokens=reply.prompt_tokens,
                  ttft=reply.ttft if reply.ok else None, e2e=reply.e2e if reply.ok else None, tpot=tpot,
                  itl=tuple(b - a for a, b in zip(times, times[1:])) if reply.ok else (),
                  decode_s=decode_s if reply.ok else None)


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


@dataclass(frozen=True)
class ServerTimes:
    """What the server's own counters say about an interval (deltas of /metrics); None where it has no counter
    or the interval held no observation."""

    tokens: float | None
    step_s: float | None  # mean engine step between two outputs of a request
    tpot_s: float | None  # mean over requests of decode time / (tokens - 1)
    ttft_s: float | None
    decode_tok_s: float | None  # one stream's decode rate: decoded tokens (first excluded) / decode time
    decode_s: float | None = None  # mean decode time of a request (first token to last)

    @property
    def timed(self) -> bool:
        return self.step_s is not None


def ms(seconds: float | None) -> float | None:
    return 1000 * seconds if seconds is not None else None


def _histogram_mean(before: dict[str, float] | None, after: dict[str, float] | None, name: str) -> float | None:
    total, count = delta(before, after, f"{name}_sum"), delta(before, after, f"{name}_count")
    return total / count if total is not None and count else None


def server_times(before: dict[str, float] | None, after: dict[str, float] | None) -> ServerTimes:
    decode_s, requests = delta(before, after, f"{DECODE}_sum"), delta(before, after, f"{DECODE}_count")
    tokens = delta(before, after, GENERATION_TOKENS)
    decode_tok_s = (tokens - requests) / decode_s if decode_s and requests and tokens is not None else None
    return ServerTimes(tokens=tokens, step_s=_histogram_mean(before, after, STEP),
                       tpot_s=_histogram_mean(before, after, TPOT), ttft_s=_histogram_mean(before, after, TTFT),
                       decode_tok_s=decode_tok_s, decode_s=decode_s / requests if decode_s and requests else None)


def burst(gaps: list[float], server: ServerTimes) -> str | None:
    """Why the client's chunk times cannot time decoding (the stream was held and flushed), or None."""
    if not gaps or server.step_s is None:
        return None
    median = statistics.median(gaps)
    if median >= BURST_FRACTION * server.step_s:
        return None
    return (f"the stream arrived in bursts: median gap between chunks {1000 * median:.3g} ms, the server's own "
            f"step {1000 * server.step_s:.3g} ms")


def disagreement(name: str, client: float | None, server: float | None, unit: str) -> str | None:
    """Why a client-side number is refuted by the server's, or None when they agree (or either is missing)."""
    if client is None or server is None or abs(client - server) <= AGREE_WITHIN * abs(server):
        return None
    return f"{name} {client:.4g} {unit} on the client's clock, {server:.4g} {unit} on the server's"


def ttft_disagreement(client_s: float | None, server: ServerTimes) -> str | None:
    """Why the client's mean TTFT is refuted by the server's counters (vLLM's time_to_first_token and decode-time
    histograms), or None: its first chunk came later than the server's TTFT and whole decode together, so the
    stream was held. A smaller excess is the HTTP path and the chat template, which the client does wait for."""
    if client_s is None or server.ttft_s is None or server.decode_s is None:
        return None
    if client_s <= server.ttft_s + server.decode_s:
        return None
    return (f"TTFT {1000 * client_s:.4g} ms on the client's clock, later than the server's own TTFT "
            f"{1000 * server.ttft_s:.4g} ms and whole decode {1000 * server.decode_s:.4g} ms: the first chunk was held")


def ttft_note(label: str, why: str, server_ms: float | None) -> str:
    """The note for a TTFT not measured on the client, with the server's own where it has one."""
    return (f"{label}: TTFT not measured on the client: {why}"
            + (f"; the server's own TTFT is {server_ms:.4g} ms" if server_ms is not None else ""))


def shortfall(name: str, client: float | None, floor: float | None, unit: str) -> str | None:
    """Why a client-side number is refuted by falling well below what the server's counters make a floor."""
    if client is None or floor is None or client >= (1 - AGREE_WITHIN) * floor:
        return None
    return f"{name} {client:.4g} {unit} on the client's clock, below the {floor:.4g} {unit} the server's imply"


AGREES, UNCHECKED = "agrees with the server", "not cross-checked"


def client_timing(refuted: str | None, server: ServerTimes) -> str:
    """The row's verdict on its client-side times: why they were refuted, or whether they were checked."""
    return refuted or (AGREES if server.timed else UNCHECKED)


NO_TIMERS = ("not cross-checked with the server: its /metrics has no vLLM timing histograms "
             f"({STEP}, {DECODE}), so client-side rates stand on the client's clock alone")
