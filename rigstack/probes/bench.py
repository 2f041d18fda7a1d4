"""Single-stream decode by workload (seed 002: 123 tok/s on code vs 37 on prose with a drafter).

Greedy, fixed output length, one request at a time. Speed is reported as tok/s and as ms per engine step: with a
speculative drafter one step emits several tokens, so tok/s alone hides whether the step or the acceptance changed.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from rigstack.client import Server
from rigstack.probes import measure
from rigstack.probes.cli import Show, Target, default_out, fail_if_unmeasured, publish
from rigstack.probes.results import Metric, Result, failure_notes, mean, provenance
from rigstack.probes.streak import STOP_AFTER, Streak, stopped_note

MIN_TOKENS_NOTE = ("output length pinned with min_tokens: the model is kept from stopping, which inflates "
                   "speculative acceptance (peers' note); prefer a server that accepts ignore_eos")
IGNORE_EOS_NOTE = "output length pinned with ignore_eos: tokens past the model's own end count too"


def _workload_row(name: str, timings: list[measure.Timing], before: dict[str, float] | None,
                  after: dict[str, float] | None, max_tokens: int) -> dict:
    ok = [t for t in timings if t.ok]
    spec = measure.spec_acceptance(before, after)
    server = measure.server_times(before, after)
    client_rate = measure.decode_rate(ok)
    # A decode rate or TTFT on the client's clock stands only when the server's own clock agrees with it; a stream
    # held and flushed in a burst times neither (its first chunk arrives with the last).
    burst = measure.burst([gap for t in ok for gap in t.itl], server)
    refuted = burst or measure.disagreement("decode", client_rate, server.decode_tok_s, "tok/s")
    ttft = mean([t.ttft for t in ok if t.ttft is not None]) if ok else None
    ttft_refuted = burst or measure.ttft_disagreement(ttft, server)
    # Tokens per engine step from the drafter's counters (1 without one). Counting stream chunks would not do:
    # the server merges a lagging client's outputs into one chunk.
    per_step = spec["spec_mean_accepted_len"] or 1.0
    if server.step_s is not None:  # the engine's own step time
        ms_per_step = 1000 * server.step_s
    else:
        ms_per_step = 1000 / client_rate * per_step if client_rate and not refuted else None
    e2e = sum(t.e2e or 0.0 for t in ok)
    return {
        "workload": name,
        "requests": len(timings),
        "failed": len(timings) - len(ok),
        "short": sum(1 for t in ok if t.tokens < max_tokens),
        "tokens": sum(t.tokens for t in ok),
        "decode_tok_s": None if refuted else client_rate,
        "server_decode_tok_s": server.decode_tok_s,
        "e2e_tok_s": sum(t.tokens for t in ok) / e2e if e2e else None,
        "ttft_ms": None if ttft_refuted else measure.ms(ttft),
        "server_ttft_ms": measure.ms(server.ttft_s),
        "ttft_timing": ttft_refuted or (measure.AGREES if server.ttft_s is not None else measure.UNCHECKED),
        "ms_per_step": ms_per_step,
        "tokens_per_step": per_step,
        "client_timing": measure.client_timing(refuted, server),
        "first_error": next((t.error for t in timings if not t.ok), None),
        **spec,
    }


async def _bench(server: Server, sets: dict[str, list[str]], max_tokens: int, fixed: measure.FixedLength,
                 repeats: int, warmup: int, stop_after: int) -> tuple[list[dict], measure.FixedLength, dict]:
    async with server.session(connections=2) as session:
        fixed = await measure.resolve_fixed_length(server, session, fixed)
        first_prompt = next(iter(sets.values()))[0]
        for _ in range(warmup):  # excluded from every number: first requests pay for lazy compilation
            await server.request(session, "/v1/chat/completions", measure.chat_payload(first_prompt, max_tokens, fixed))
        rows = []
        for name, prompts in sets.items():
            before = await server.scrape(session)
            timings, streak, planned = [], Streak(stop_after), prompts * repeats
            for prompt in planned:
                if streak.over:
                    break
                reply = await server.request(session, "/v1/chat/completions",
                                             measure.chat_payload(prompt, max_tokens, fixed))
                timings.append(measure.timing(reply))
                streak.record(reply.ok)
            after = await server.scrape(session)
            rows.append({**_workload_row(name, timings, before, after, max_tokens),
                         "not_sent": len(planned) - len(timings)})
        params = measure.request_params(measure.chat_payload(first_prompt, max_tokens, fixed))
        return rows, fixed, params


def run_bench(server: Server, workloads: list[str], max_tokens: int, fixed: measure.FixedLength, repeats: int,
              warmup: int, profile: str | None, package: Path | None, stop_after: int = STOP_AFTER) -> Result:
    card = server.check_model()
    sets = measure.workload_prompts(workloads)
    measure.check_fits(server, card, max_tokens, [measure.chat_payload(prompt, max_tokens, "none")
                                                  for prompts in sets.values() for prompt in prompts])
    rows, used, params = asyncio.run(_bench(server, sets, max_tokens, fixed, repeats, warmup, stop_after))
    notes = {"min_tokens": [MIN_TOKENS_NOTE], "ignore_eos": [IGNORE_EOS_NOTE]}.get(used, [
        "output length not pinned: the server accepted neither ignore_eos nor min_tokens"])
    notes += failure_notes(row["first_error"] for row in rows if row["first_error"])
    notes += [stopped_note(f"workload {row['workload']}", stop_after, row["not_sent"],
                           row["requests"] + row["not_sent"]) for row in rows if row["not_sent"]]
    if any(row["short"] for row in rows):
        notes.append("some answers stopped before max_tokens; their tok/s still counts what was generated")
    for row in rows:
        if row["decode_tok_s"] is None and row["requests"] > row["failed"]:
            server_rate = row["server_decode_tok_s"]
            notes.append(f"{row['workload']}: decode tok/s not measured on the client: {row['client_timing']}"
                         + (f"; the server's own decode rate is {server_rate:.4g} tok/s" if server_rate else ""))
        if row["ttft_ms"] is None and row["requests"] > row["failed"]:
            notes.append(measure.ttft_note(row["workload"], row["ttft_timing"], row["server_ttft_ms"]))
    if all(row["client_timing"] == measure.UNCHECKED for row in rows):
        notes.append(measure.NO_TIMERS)
    if all(row["spec_acceptance_rate"] is None for row in rows):
        notes.append("no speculative decoding counters in /metrics")
    metrics: dict[str, Metric] = {}
    for row in rows:
        name = row["workload"]
        metrics[f"{name}.decode_tok_s"] = Metric(value=row["decode_tok_s"], better="higher", unit="tok/s")
        metrics[f"{name}.server_decode_tok_s"] = Metric(value=row["server_decode_tok_s"], better="higher",
                                                        unit="tok/s")
        metrics[f"{name}.ms_per_step"] = Metric(value=row["ms_per_step"], better="lower", unit="ms")
        metrics[f"{name}.ttft_ms"] = Metric(value=row["ttft_ms"], better="lower", unit="ms")
        metrics[f"{name}.failed"] = Metric(value=row["failed"], better="lower")
        if row["spec_acceptance_rate"] is not None:
            metrics[f"{name}.spec_acceptance_rate"] = Metric(value=row["spec_acceptance_rate"], better="higher")
    params = {**params, "fixed_length": used, "repeats": repeats, "warmup": warmup, "workloads": workloads,
              "stop_after_failures": stop_after}
    return Result(kind="bench", provenance=provenance(server, profile, package, params), metrics=metrics, rows=rows,
                  notes=notes)


def main(target: Target, workloads: list[str], max_tokens: int, fixed: measure.FixedLength, repeats: int,
         warmup: int, out: Path | None, show: Show) -> int:
    out = default_out("bench", out)
    server = target.server()
    result = run_bench(server, workloads, max_tokens, fixed, repeats, warmup, target.profile, target.package,
                       target.stop_after)
    show(publish(result, out, server))
    dead = [row for row in result.rows if row["failed"] == row["requests"]]
    return fail_if_unmeasured([f"workload {row['workload']}" for row in dead], dead[0]["first_error"] if dead else None)
