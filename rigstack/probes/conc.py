"""Concurrency: a closed-loop sweep (1, 2, 4, ... N streams back to back) and an open-loop Poisson rate mode.

Client-side numbers (TTFT, TPOT, ITL, E2E, per-stream tok/s) come from the streamed chunks; token counts from the
server's usage block. The steady-state aggregate is read from the server's generated-token counter over the
intervals when every stream was decoding (seed 001's method), so prefill gaps and the ramp do not dilute it.
Failed requests are counted per level, never dropped.
"""

from __future__ import annotations

import asyncio
import random
import time
from pathlib import Path

import httpx

from rigstack.client import Reply, Server
from rigstack.errors import UserError
from rigstack.probes import measure
from rigstack.probes.cli import Show, Target, default_out, fail_if_unmeasured, publish
from rigstack.probes.results import Metric, Result, failure_notes, mean, percentiles, provenance
from rigstack.probes.streak import STOP_AFTER, Streak, stopped_note

CHAT = "/v1/chat/completions"


class _Level:
    """What one sweep level (or rate) collected."""

    def __init__(self, planned: int = 0, stop_after: int = STOP_AFTER) -> None:
        self.planned = planned
        self.streak = Streak(stop_after)  # failures in a row, in the order the replies came back
        self.replies: list[Reply] = []
        self.samples: list[tuple[float, float]] = []  # (perf_counter, generation-token counter)
        self.counters: list[dict[str, float]] = []  # every counter, at the first and the latest sample
        self.start = 0.0
        self.end = 0.0

    def add(self, reply: Reply) -> None:
        self.replies.append(reply)
        self.streak.record(reply.ok)


async def _sample_counter(server: Server, session: httpx.AsyncClient, level: _Level, interval_s: float,
                          stop: asyncio.Event, primed: asyncio.Event) -> None:
    """One sample before the first request (primed tells the level to start), then every interval, and one after
    the level's last reply."""
    while True:
        counters = await server.scrape(session)
        primed.set()
        if counters is None or measure.GENERATION_TOKENS not in counters:
            return  # no counter: no server-side numbers for this level
        level.samples.append((time.perf_counter(), counters[measure.GENERATION_TOKENS]))
        level.counters[1:] = [counters]
        if stop.is_set():
            return
        try:
            await asyncio.wait_for(stop.wait(), interval_s)
        except TimeoutError:
            pass


def _decoding(replies: list[Reply], start: float, end: float) -> int:
    """Streams that were between their first and last output chunk for the whole of [start, end]."""
    return sum(1 for r in replies if r.chunk_times and r.chunk_times[0] <= start and r.chunk_times[-1] >= end)


def _steady_tok_s(level: _Level, streams: int) -> float | None:
    tokens = seconds = 0.0
    for (t0, c0), (t1, c1) in zip(level.samples, level.samples[1:]):
        if _decoding(level.replies, t0, t1) >= streams:
            tokens += c1 - c0
            seconds += t1 - t0
    return tokens / seconds if seconds else None


def _row(label: str, value: float, level: _Level, streams: int | None) -> dict:
    timings = [measure.timing(reply) for reply in level.replies]
    ok = [t for t in timings if t.ok]
    wall = level.end - level.start
    row: dict = {label: value, "requests": len(timings), "ok": len(ok), "failed": len(timings) - len(ok),
                 "output_tokens": sum(t.tokens for t in ok),
                 "prompt_tokens": sum(t.prompt_tokens or 0 for t in ok), "wall_s": wall}
    first, last = (level.counters[0], level.counters[-1]) if level.counters else (None, None)
    server = measure.server_times(first, last)
    gaps = [gap for t in ok for gap in t.itl]
    per_stream = measure.decode_rate(ok)
    tpot = mean([t.tpot for t in ok if t.tpot is not None])
    # The steady-state window is picked by the client's chunk times, so it stands or falls with them.
    steady = _steady_tok_s(level, streams) if streams else None
    # Client-side decode times stand only when the server's own clock agrees (seed: a burst gave 0.07 ms TPOT).
    # A burst voids everything timed by chunk arrivals; otherwise each number is checked on its own.
    burst = measure.burst(gaps, server)
    refuted = {
        # A held stream's first chunk arrives with its last: the client's TTFT is then its E2E.
        "TTFT": burst or measure.ttft_disagreement(mean([t.ttft for t in ok if t.ttft is not None]), server),
        "ITL": burst,
        "TPOT": burst or measure.disagreement("TPOT", measure.ms(tpot), measure.ms(server.tpot_s), "ms"),
        "per-stream tok/s": burst or measure.disagreement("per-stream decode", per_stream, server.decode_tok_s,
                                                          "tok/s"),
        # While every stream decodes no prefill slows the steps, so steady-state may beat streams x the server's
        # per-stream rate (which counts prefill-slowed steps), but it never falls far below it.
        "steady-state tok/s": burst or measure.shortfall(
            "steady-state", steady, streams * server.decode_tok_s if streams and server.decode_tok_s else None,
            "tok/s"),
    }
    row["client_timing"] = measure.client_timing("; ".join(dict.fromkeys(why for why in refuted.values() if why)),
                                                 server)
    row["not_measured"] = ", ".join(name for name, why in refuted.items() if why)
    for name, values, why in (("ttft_ms", [t.ttft for t in ok], refuted["TTFT"]),
                              ("tpot_ms", [t.tpot for t in ok], refuted["TPOT"]),
                              ("itl_ms", gaps, refuted["ITL"]), ("e2e_ms", [t.e2e for t in ok], None)):
        for point, number in percentiles([1000 * v for v in values if v is not None]).items():
            row[f"{name}_{point}"] = None if why else number
    row["server_tpot_ms"] = measure.ms(server.tpot_s)
    row["server_step_ms"] = measure.ms(server.step_s)
    row["server_ttft_ms"] = measure.ms(server.ttft_s)
    row["aggregate_tok_s"] = row["output_tokens"] / wall if wall > 0 and ok else None
    row["per_stream_tok_s"] = None if refuted["per-stream tok/s"] else per_stream
    row["server_per_stream_tok_s"] = server.decode_tok_s
    row["server_tokens"] = level.samples[-1][1] - level.samples[0][1] if len(level.samples) > 1 else None
    row["steady_tok_s"] = None if refuted["steady-state tok/s"] else steady
    row["first_error"] = next((t.error for t in timings if not t.ok), None)
    return row


async def _closed_level(server: Server, session: httpx.AsyncClient, streams: int, requests: int,
                        payloads: list[dict], interval_s: float, stop_after: int) -> _Level:
    level, stop = _Level(requests, stop_after), asyncio.Event()
    queue = iter(range(requests))

    async def stream() -> None:
        for index in queue:  # shared iterator: each stream takes the next request when its last one ends
            if level.streak.over:
                return
            level.add(await server.request(session, CHAT, payloads[index % len(payloads)]))

    primed = asyncio.Event()
    sampler = asyncio.create_task(_sample_counter(server, session, level, interval_s, stop, primed))
    await primed.wait()
    level.start = time.perf_counter()
    await asyncio.gather(*(stream() for _ in range(streams)))
    level.end = time.perf_counter()
    stop.set()
    await sampler
    return level


async def _open_level(server: Server, session: httpx.AsyncClient, rate: float, requests: int, payloads: list[dict],
                      interval_s: float, seed: int, stop_after: int) -> _Level:
    level, stop, rng = _Level(requests, stop_after), asyncio.Event(), random.Random(seed)

    async def one(index: int, delay: float) -> None:
        await asyncio.sleep(delay)
        if not level.streak.over:  # arrivals after N failures in a row are not sent
            level.add(await server.request(session, CHAT, payloads[index % len(payloads)]))

    arrivals, clock = [], 0.0
    for _ in range(requests):  # Poisson process: exponential gaps, seeded so reruns send the same schedule
        arrivals.append(clock)
        clock += rng.expovariate(rate)
    primed = asyncio.Event()
    sampler = asyncio.create_task(_sample_counter(server, session, level, interval_s, stop, primed))
    await primed.wait()
    level.start = time.perf_counter()
    await asyncio.gather(*(one(i, at) for i, at in enumerate(arrivals)))
    level.end = time.perf_counter()
    stop.set()
    await sampler
    return level


async def _run(server: Server, levels: list[int], rates: list[float], requests: int, payloads: list[dict],
               interval_s: float, seed: int, warmup: int, stop_after: int) -> list[tuple[bool, float, _Level]]:
    width = max(levels or [1]) + 2 if not rates else 1024
    async with server.session(connections=width) as session:
        for _ in range(warmup):
            await server.request(session, CHAT, payloads[0])
        done = []
        for streams in levels:
            level = await _closed_level(server, session, streams, requests or streams * 4, payloads, interval_s,
                                        stop_after)
            done.append((True, streams, level))
        for rate in rates:
            level = await _open_level(server, session, rate, requests or 32, payloads, interval_s, seed, stop_after)
            done.append((False, rate, level))
        return done


# A level's row fields that become its metrics: which way is better, and the unit.
LEVEL_METRICS = (("aggregate_tok_s", "higher", "tok/s"), ("steady_tok_s", "higher", "tok/s"),
                 ("per_stream_tok_s", "higher", "tok/s"), ("server_per_stream_tok_s", "higher", "tok/s"),
                 ("ttft_ms_p50", "lower", "ms"), ("tpot_ms_p50", "lower", "ms"), ("server_tpot_ms", "lower", "ms"),
                 ("failed", "lower", ""))


def run_conc(server: Server, levels: list[int], rates: list[float], requests: int, workload: str, max_tokens: int,
             fixed: measure.FixedLength, interval_s: float, seed: int, warmup: int, profile: str | None,
             package: Path | None, stop_after: int = STOP_AFTER) -> Result:
    """levels: closed-loop stream counts; rates: open-loop requests/s. requests: per level (0 = 4 per stream)."""
    card = server.check_model()
    prompts = measure.workload_prompts([workload])[workload]
    measure.check_fits(server, card, max_tokens,
                       [measure.chat_payload(prompt, max_tokens, "none") for prompt in prompts])

    async def resolve() -> measure.FixedLength:
        async with server.session(connections=2) as session:
            return await measure.resolve_fixed_length(server, session, fixed)

    used = asyncio.run(resolve())
    payloads = [measure.chat_payload(prompt, max_tokens, used) for prompt in prompts]
    done = asyncio.run(_run(server, levels, rates, requests, payloads, interval_s, seed, warmup, stop_after))
    rows, metrics, errors = [], {}, []
    for closed, value, level in done:
        key = f"c{int(value)}" if closed else f"r{value:g}"
        row = {"level": key, **_row("concurrency" if closed else "rate", value, level, int(value) if closed else None),
               "mode": "closed" if closed else "open", "not_sent": level.planned - len(level.replies)}
        rows.append(row)
        errors += [reply.error for reply in level.replies if not reply.ok]
        metrics |= {f"{key}.{name}": Metric(value=row[name], better=better, unit=unit)
                    for name, better, unit in LEVEL_METRICS}
    notes = failure_notes(errors)
    notes += [stopped_note(f"level {row['level']}", stop_after, row["not_sent"], row["requests"] + row["not_sent"])
              for row in rows if row["not_sent"]]
    for row in rows:
        if row["ok"] and row["not_measured"]:
            notes.append(f"{row['level']}: {row['not_measured']} not measured on the client: {row['client_timing']}"
                         + (f"; the server's own TPOT is {row['server_tpot_ms']:.4g} ms, per-stream "
                            f"{row['server_per_stream_tok_s']:.4g} tok/s" if row["server_per_stream_tok_s"] else "")
                         + (f"; the server's own TTFT is {row['server_ttft_ms']:.4g} ms"
                            if "TTFT" in row["not_measured"] and row["server_ttft_ms"] is not None else ""))
    if any(row["server_tokens"] is None for row in rows):
        notes.append("no vllm:generation_tokens counter in /metrics: server-side and steady-state numbers missing")
    else:
        short = [row["level"] for row in rows if row["mode"] == "closed" and row["steady_tok_s"] is None
                 and "steady" not in row["not_measured"]]
        if short:
            notes.append(f"{', '.join(short)}: no /metrics interval with every stream decoding; raise --max-tokens "
                         "or lower --interval for a steady-state number")
    if all(row["client_timing"] == measure.UNCHECKED for row in rows):
        notes.append(measure.NO_TIMERS)
    params = {**measure.request_params(payloads[0]), "fixed_length": used, "levels": levels, "rates": rates,
              "requests_per_level": requests, "workload": workload, "metrics_interval_s": interval_s, "seed": seed,
              "warmup": warmup, "stop_after_failures": stop_after}
    return Result(kind="conc", provenance=provenance(server, profile, package, params), metrics=metrics, rows=rows,
                  notes=notes)


def plot_conc(result: Result, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (speed, latency) = plt.subplots(1, 2, figsize=(11, 4))
    for mode, label in (("closed", "concurrency"), ("open", "rate")):
        rows = [row for row in result.rows if row["mode"] == mode]
        if not rows:
            continue
        xs = [row[label] for row in rows]
        for key, style in (("aggregate_tok_s", "o-"), ("steady_tok_s", "s--"), ("per_stream_tok_s", "^:")):
            speed.plot(xs, [row[key] if row[key] is not None else float("nan") for row in rows], style,
                       label=f"{key} ({mode})")
        for key, style in (("ttft_ms_p50", "o-"), ("ttft_ms_p99", "o--"), ("tpot_ms_p50", "^-")):
            latency.plot(xs, [row[key] if row[key] is not None else float("nan") for row in rows], style,
                         label=f"{key} ({mode})")
    speed.set(xlabel="streams (closed) or requests/s (open)", ylabel="tok/s", title="throughput")
    latency.set(xlabel="streams (closed) or requests/s (open)", ylabel="ms", title="latency", yscale="log")
    speed.legend(fontsize=7)
    latency.legend(fontsize=7)
    fig.suptitle(f"{result.provenance.model} @ {result.provenance.url}", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, format="png", dpi=100)
    plt.close(fig)


def parse_list(text: str, kind: type, option: str) -> list:
    try:
        values = [kind(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise UserError(f"{option} {text!r}: expected comma-separated numbers, like {option} 1,2,4,8") from None
    if any(value <= 0 for value in values):
        raise UserError(f"{option} {text!r}: every value must be above 0")
    return values


def main(target: Target, levels: str, rates: str, requests: int, workload: str, max_tokens: int,
         fixed: measure.FixedLength, interval_s: float, seed: int, warmup: int, out: Path | None,
         show: Show) -> int:
    """levels/rates as typed on the command line; levels default to 1,2,4,8 when neither is given."""
    rate_list = parse_list(rates, float, "--rates")
    level_list = parse_list(levels or ("" if rate_list else "1,2,4,8"), int, "--levels")
    out = default_out("conc", out)
    server = target.server()
    result = run_conc(server, level_list, rate_list, requests, workload, max_tokens, fixed, interval_s, seed,
                      warmup, target.profile, target.package, target.stop_after)
    show(publish(result, out, server, plot_conc))
    dead = [row for row in result.rows if not row["ok"]]
    return fail_if_unmeasured([row["level"] for row in dead], dead[0]["first_error"] if dead else None)
