"""Needle in a haystack: a grid of context lengths x depths, one planted fact per cell, pass/fail per cell.

The haystack is sized with the server's own tokenizer (vLLM's /tokenize) when it has one, so "8k" means 8k tokens
of this model; cells that cannot fit max_model_len are reported as skipped, never as failures.
"""

from __future__ import annotations

import asyncio
import random
from pathlib import Path

from rigstack.client import Server
from rigstack.errors import UserError
from rigstack.probes import measure
from rigstack.probes.cli import Show, Target, default_out, fail_if_unmeasured, publish
from rigstack.probes.results import Metric, Result, failure_notes, provenance
from rigstack.probes.streak import STOP_AFTER, Streak, stopped_note

# Bland, varied filler: the needle must not be the only sentence with a number in it.
FILLER = (
    "The river town held its market every Thursday, and the stalls opened before the fog lifted.",
    "A ledger from 1894 lists 312 barrels of salt, 48 crates of nails and one church bell.",
    "Most of the orchard was replanted after the frost, though the oldest pear trees survived.",
    "The ferry schedule changed twice that summer, first for the regatta and then for repairs.",
    "Engineers measured the bridge deck at 41 points and found the sag within tolerance.",
    "In winter the library moved its reading room to the warmer east wing of the building.",
    "The school choir rehearsed on Tuesdays, and the conductor kept a jar of peppermints on the piano.",
    "Freight trains passed at night, and the signal box logged each one with the time and the load.",
)
NEEDLE = "The access code for the {place} vault is {code}."
QUESTION = "What is the access code for the {place} vault? Answer with the code only."
PLACES = ("harbour", "granary", "observatory", "foundry", "archive", "lighthouse")
ANSWER_TOKENS = 24
TEMPLATE_TOKENS = 8  # chat-template markers around the user turn, roughly


def _haystack(tokens: int, sentence_tokens: float, depth: float, needle: str) -> str:
    count = max(1, int(tokens / sentence_tokens))
    sentences = [FILLER[i % len(FILLER)] for i in range(count)]
    sentences.insert(round(depth * count), needle)
    return " ".join(sentences)


def _cell(server: Server, length: int, depth: float, sentence_tokens: float, overhead: int,
          max_model_len: int | None, seed: int) -> dict:
    """One cell; `length` is the whole prompt (haystack, needle, question and chat template) in tokens."""
    rng = random.Random(f"{seed}:{length}:{depth}")
    place, code = rng.choice(PLACES), str(rng.randint(100000, 999999))
    row = {"length": length, "depth": depth, "code": code, "prompt_tokens": None, "status": "skipped",
           "answer": ""}
    if max_model_len is not None and length + ANSWER_TOKENS > max_model_len:
        row["answer"] = f"does not fit max_model_len {max_model_len}"
        return row
    text = _haystack(length - overhead, sentence_tokens, depth, NEEDLE.format(place=place, code=code))
    payload = {"messages": [{"role": "user", "content": f"{text}\n\n{QUESTION.format(place=place)}"}],
               "max_tokens": ANSWER_TOKENS, "temperature": 0.0}

    async def ask():  # one request per cell: a fresh session keeps cells independent
        async with server.session(connections=1) as session:
            return await server.request(session, "/v1/chat/completions", payload)

    reply = asyncio.run(ask())
    row["prompt_tokens"] = reply.prompt_tokens
    if not reply.ok:
        row.update(status="error", answer=reply.error or "")
        return row
    answer = (reply.text or reply.reasoning).strip()
    row.update(status="pass" if code in answer else "fail", answer=answer[:80])
    return row


def _cells(server: Server, lengths: list[int], depths: list[float], sentence_tokens: float, overhead: int,
           max_model_len: int | None, seed: int, stop_after: int) -> list[dict]:
    """Every cell in order; after `stop_after` errors in a row the rest are "not-sent" (each could cost --timeout)."""
    rows, streak = [], Streak(stop_after)
    for length in lengths:
        for depth in depths:
            if streak.over:
                rows.append({"length": length, "depth": depth, "code": "", "prompt_tokens": None,
                             "status": "not-sent", "answer": ""})
                continue
            rows.append(_cell(server, length, depth, sentence_tokens, overhead, max_model_len, seed))
            if rows[-1]["status"] != "skipped":
                streak.record(rows[-1]["status"] != "error")
    return rows


def run_needle(server: Server, lengths: list[int], depths: list[float], seed: int, profile: str | None,
               package: Path | None, stop_after: int = STOP_AFTER) -> Result:
    card = server.check_model()
    bad = [d for d in depths if not 0.0 <= d <= 1.0]
    if bad:
        raise UserError(f"depth {bad[0]} is outside 0..1; pass --depths like 0,0.25,0.5,0.75,1")
    max_model_len = measure.max_model_len(card)
    too_long = [length for length in lengths if max_model_len is not None and length + ANSWER_TOKENS > max_model_len]
    if too_long and len(too_long) == len(lengths):
        raise UserError(f"no --lengths fit the server: its max_model_len is {max_model_len} and each cell needs "
                        f"its length plus {ANSWER_TOKENS} answer tokens; pass --lengths up to "
                        f"{max_model_len - ANSWER_TOKENS}")
    sample = " ".join(FILLER)
    counted = server.tokenize(sample)
    # Without /tokenize, about 4 characters per token is the usual English rate; prompt_tokens shows the truth.
    sentence_tokens = (counted or len(sample) / 4) / len(FILLER)
    extra = NEEDLE.format(place=PLACES[0], code="123456") + QUESTION.format(place=PLACES[0])
    overhead = (server.tokenize(extra) or len(extra) // 4) + TEMPLATE_TOKENS
    rows = _cells(server, lengths, depths, sentence_tokens, overhead, max_model_len, seed, stop_after)
    passed = sum(row["status"] == "pass" for row in rows)
    tried = sum(row["status"] in ("pass", "fail", "error") for row in rows)
    metrics = {"passed": Metric(value=passed, better="higher"), "tried": Metric(value=tried, better="equal"),
               "errors": Metric(value=sum(row["status"] == "error" for row in rows), better="lower")}
    notes = [f"{passed} of {tried} cells passed"]
    if too_long:
        notes.append(f"lengths {', '.join(map(str, too_long))} skipped: they do not fit the server's max_model_len "
                     f"{max_model_len} (plus {ANSWER_TOKENS} answer tokens)")
    notes += failure_notes(row["answer"] for row in rows if row["status"] == "error")
    not_sent = sum(row["status"] == "not-sent" for row in rows)
    if not_sent:
        notes.append(stopped_note("the needle grid", stop_after, not_sent, tried + not_sent))
    if counted is None:
        notes.append("server has no /tokenize: lengths estimated at 4 characters per token")
    params = {"lengths": lengths, "depths": depths, "seed": seed, "max_tokens": ANSWER_TOKENS, "temperature": 0.0,
              "sentence_tokens": sentence_tokens, "stop_after_failures": stop_after}
    return Result(kind="needle", provenance=provenance(server, profile, package, params), metrics=metrics, rows=rows,
                  notes=notes)


def plot_needle(result: Result, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.colors import ListedColormap

    lengths = sorted({row["length"] for row in result.rows})
    depths = sorted({row["depth"] for row in result.rows})
    code = {"pass": 2, "fail": 1, "error": 0, "skipped": -1, "not-sent": -1}
    grid = [[-1] * len(lengths) for _ in depths]
    for row in result.rows:
        grid[depths.index(row["depth"])][lengths.index(row["length"])] = code[row["status"]]
    fig, ax = plt.subplots(figsize=(1.2 + 0.9 * len(lengths), 1.2 + 0.6 * len(depths)))
    ax.imshow(grid, cmap=ListedColormap(["#dddddd", "#555555", "#d62728", "#2ca02c"]), vmin=-1.5, vmax=2.5,
              aspect="auto")
    ax.set_xticks(range(len(lengths)), [str(length) for length in lengths])
    ax.set_yticks(range(len(depths)), [f"{depth:.0%}" for depth in depths])
    ax.set(xlabel="context length (tokens)", ylabel="needle depth",
           title="green pass, red fail, dark error, grey skipped or not sent")
    fig.tight_layout()
    fig.savefig(path, format="png", dpi=100)
    plt.close(fig)


def main(target: Target, lengths: list[int], depths: list[float], seed: int, out: Path | None,
         show: Show) -> int:
    out = default_out("needle", out)
    server = target.server()
    result = run_needle(server, lengths, depths, seed, target.profile, target.package, target.stop_after)
    show(publish(result, out, server, plot_needle))
    tried = [row for row in result.rows if row["status"] not in ("skipped", "not-sent")]
    dead = bool(tried) and all(row["status"] == "error" for row in tried)
    return fail_if_unmeasured(["the needle grid"] if dead else [], tried[0]["answer"] if dead else None)
