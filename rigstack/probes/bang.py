"""Seed 003's silent-corruption probe: N greedy repeats of one prompt must be identical, with no token id 0 and no
token whose logprob sits at -ln(vocab) (a uniform distribution: the signature of all-zero rows from a bad card).
Token id 0 counts only where it is an ordinary token: a model whose EOS or padding is id 0 (the tiny CPU model)
emits it by design, and more so under ignore_eos.

Greedy decoding on a healthy server is bit-identical run to run, so any divergence is a finding; its first
differing position is reported so a rerun can look there.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import math
from dataclasses import dataclass
from pathlib import Path

from rigstack.client import Reply, Server
from rigstack.errors import UserError
from rigstack.probes.cli import Show, Target, default_out, publish, requests_failed
from rigstack.probes.measure import check_fits
from rigstack.probes.results import Metric, Result, failure_notes, provenance

DEFAULT_PROMPT = ("Write a detailed technical report on the history of railway signalling, with numbered sections, "
                  "dates, and a table of the main systems.")
EXIT_CORRUPT = 2


@dataclass(frozen=True)
class Flag:
    run: int
    position: int
    token_id: int | None
    logprob: float | None
    why: str


@dataclass(frozen=True)
class ModelFacts:
    """What the served model's folder says, when it is on this host (None where it is not)."""
    vocab_size: int | None
    special_ids: frozenset[int] | None  # ids the model may emit by design (EOS, padding, added special tokens)


def _json_file(path: Path) -> dict:
    try:
        raw = json.loads(path.read_text()) if path.is_file() else {}
    except (OSError, ValueError):
        return {}
    return raw if isinstance(raw, dict) else {}


def _ids(value: object) -> set[int]:
    items = value if isinstance(value, list) else [value]
    return {item for item in items if isinstance(item, int) and not isinstance(item, bool)}


def model_facts(card: dict) -> ModelFacts:
    """The served model's vocabulary and special token ids, from its folder (config.json, generation_config.json
    and the tokenizer's files) when the card's root is a folder on this host."""
    root = Path(card["root"]) if card.get("root") else None
    if root is None or not (root / "config.json").is_file():
        return ModelFacts(None, None)
    config = _json_file(root / "config.json")
    configs = [config, config.get("text_config") or {}, _json_file(root / "generation_config.json")]
    special = {token for raw in configs for key in ("eos_token_id", "bos_token_id", "pad_token_id")
               for token in _ids(raw.get(key))}
    added = _json_file(root / "tokenizer.json").get("added_tokens") or []
    special |= {token["id"] for token in added if isinstance(token, dict) and token.get("special")
                and isinstance(token.get("id"), int)}
    decoder = _json_file(root / "tokenizer_config.json").get("added_tokens_decoder") or {}
    special |= {int(key) for key, token in decoder.items()
                if key.isdigit() and isinstance(token, dict) and token.get("special")}
    vocab = config.get("vocab_size") or (config.get("text_config") or {}).get("vocab_size")
    return ModelFacts(vocab if isinstance(vocab, int) else None, frozenset(special))


def first_difference(a: list[int], b: list[int]) -> int | None:
    """The first position where two token sequences differ (a length difference counts), None if equal."""
    for position, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return position
    return None if len(a) == len(b) else min(len(a), len(b))


def flags_of(run: int, reply: Reply, floor: float | None, tol: float,
             special_ids: frozenset[int] | None = None) -> list[Flag]:
    """The tokens that look like all-zero rows: token id 0 where it is an ordinary token (seed 003's rule; a model
    whose EOS or padding is id 0 emits it legitimately, the more so under ignore_eos), and any token at -ln(vocab)
    (a uniform distribution, whatever the token). `special_ids` None: unknown, id 0 is taken as ordinary."""
    found = []
    zero_is_ordinary = special_ids is None or 0 not in special_ids
    for position, token in enumerate(reply.token_ids):
        logprob = reply.logprobs[position] if position < len(reply.logprobs) else None
        if token == 0 and zero_is_ordinary:
            found.append(Flag(run, position, token, logprob, "token id 0"))
        elif floor is not None and logprob is not None and logprob <= floor + tol:
            found.append(Flag(run, position, token, logprob, f"logprob {logprob:.3f} ~ -ln(vocab) {floor:.3f}"))
    return found


async def _repeat(server: Server, payloads: list[dict], repeats: int) -> list[list[Reply]]:
    async with server.session(connections=1) as session:  # one at a time: the batch shape must not vary
        return [[await server.request(session, "/v1/completions", payload) for _ in range(repeats)]
                for payload in payloads]


def _limits(floor: float | None, special_ids: frozenset[int] | None) -> list[str]:
    """What the judgement could not check, or checked differently, for this model."""
    notes = []
    if floor is None:
        notes.append("vocab size unknown (pass --vocab-size): only token id 0 was checked, not -ln(vocab)")
    if special_ids is None:
        notes.append("special tokens unknown (the model folder is not on this host): token id 0 was flagged as an "
                     "ordinary token; if it is the model's EOS, run the probe where the folder is")
    elif 0 in special_ids:
        notes.append("token id 0 is one of the model's special tokens (EOS, padding or added): not flagged by id, "
                     "only at -ln(vocab)")
    return notes


def _verdict(suspect: bool, failed: list[str], requests: int, answered: bool) -> str:
    # A failed request is a failure, never evidence of corruption: only answers that came back are judged.
    if suspect:
        return "CORRUPTION SUSPECTED"
    if failed:
        return (f"NOT JUDGED: {len(failed)} of {requests} requests failed ({failed[0]})" if answered
                else f"NOT JUDGED: every request failed ({failed[0]})")
    return "clean: all runs identical, nothing flagged"


def run_bang(server: Server, prompts: list[str], max_tokens: int, repeats: int, vocab_size: int | None, tol: float,
             profile: str | None, package: Path | None) -> Result:
    card = server.check_model()
    facts = model_facts(card)
    vocab = vocab_size or facts.vocab_size
    floor = -math.log(vocab) if vocab else None
    params = {"max_tokens": max_tokens, "temperature": 0.0, "logprobs": 1, "return_tokens_as_token_ids": True,
              "ignore_eos": True}
    bodies = [{"prompt": prompt, **params} for prompt in prompts]
    check_fits(server, card, max_tokens, bodies)
    batches = asyncio.run(_repeat(server, bodies, repeats))
    if any(reply.ok and not reply.token_ids for replies in batches for reply in replies):
        raise UserError(f"{server.endpoint.base} returned no token ids (vLLM's return_tokens_as_token_ids); the "
                        "corruption probe needs them: point --url at a vLLM server")
    rows, flags, samples, notes = [], [], [], []
    for index, replies in enumerate(batches):
        reference = next((reply.token_ids for reply in replies if reply.ok), [])
        for run, reply in enumerate(replies):
            found = flags_of(run, reply, floor, tol, facts.special_ids) if reply.ok else []
            flags.extend((index, flag) for flag in found)
            diverge = first_difference(reference, reply.token_ids) if reply.ok else None
            rows.append({"prompt": index, "run": run, "ok": reply.ok, "error": reply.error or "",
                         "tokens": len(reply.token_ids), "first_difference": diverge, "flags": len(found),
                         "first_flag": f"{found[0].why} at {found[0].position}" if found else ""})
            if diverge is not None:
                notes.append(f"prompt {index} run {run} diverges from its first run at position {diverge}")
            if reply.ok:
                samples.append({"prompt": index, "run": run, "token_ids": reply.token_ids,
                                "logprobs": reply.logprobs})
        if reference and len(reference) < max_tokens:
            notes.append(f"prompt {index}: only {len(reference)} of {max_tokens} tokens came back")
    notes = [f"prompt {i} run {f.run} position {f.position}: token {f.token_id}, {f.why}"
             for i, f in flags[:20]] + notes
    notes.extend(_limits(floor, facts.special_ids))
    divergent = sum(row["first_difference"] is not None for row in rows)
    failed = [row["error"] for row in rows if not row["ok"]]
    suspect = bool(flags or divergent)
    clean = not suspect and not failed and bool(samples)
    notes.insert(0, _verdict(suspect, failed, len(rows), bool(samples)))
    notes[1:1] = failure_notes(failed)
    metrics = {"clean": Metric(value=float(clean), better="higher"),
               "flagged_tokens": Metric(value=len(flags), better="lower"),
               "divergent_runs": Metric(value=divergent, better="lower"),
               "failed": Metric(value=len(failed), better="lower")}
    specials = sorted(facts.special_ids) if facts.special_ids is not None else None
    params = {**params, "repeats": repeats, "vocab_size": vocab, "logprob_floor": floor, "tol": tol,
              "special_ids": specials,
              "prompt_sha256": [hashlib.sha256(prompt.encode()).hexdigest()[:16] for prompt in prompts]}
    return Result(kind="bang", provenance=provenance(server, profile, package, params), metrics=metrics, rows=rows,
                  notes=notes, samples=samples)


def is_suspect(result: Result) -> bool:
    """The answers that came back show corruption (flagged tokens or runs that diverge)."""
    return bool(result.metrics["flagged_tokens"].value or result.metrics["divergent_runs"].value)


def failures(result: Result, label: str) -> UserError | None:
    """The error to raise when some of the result's requests failed, with the server's message."""
    failed = [row for row in result.rows if not row["ok"]]
    if not failed:
        return None
    return requests_failed(f"{len(failed)} of the {len(result.rows)} runs of {label} failed", failed[0]["error"])


def exit_code(result: Result) -> int:
    """2 when the answers that came back look corrupt; else a raised EXIT_FAILED error when requests failed (a
    failure is never read as corruption); 0 when clean."""
    if is_suspect(result):
        return EXIT_CORRUPT
    error = failures(result, "the probe")
    if error:
        raise error
    return 0


def main(target: Target, prompts: list[str], max_tokens: int, repeats: int, vocab_size: int | None, tol: float,
         out: Path | None, show: Show) -> int:
    out = default_out("bang", out)
    server = target.server()
    result = run_bang(server, prompts or [DEFAULT_PROMPT], max_tokens, repeats, vocab_size, tol, target.profile,
                      target.package)
    show(publish(result, out, server))
    return exit_code(result)
