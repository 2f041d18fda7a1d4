"""Expert-pick traces and per-layer hot sets for expert offload (issue 17, seed 000; patch 0014).

A server started with VLLM_EXPERT_COUNTS=1 and VLLM_SERVER_DEV_MODE=1 counts every MoE layer's picks per expert on
the device and returns them through vLLM's dev endpoint (POST /collective_rpc, method `expert_offload_counts`).
From those counts this module reports how concentrated each layer's routing is (the share of the picks the
hottest 35% of its experts take; seed 000 saw 74%), sizes the cache from a device budget with the cost model
(rigstack.offload_model), chooses each layer's own hottest experts, and writes the hot-set file that
VLLM_EXPERT_OFFLOAD names. It also gives the hit rate of one hot set chosen from the counts summed over all layers,
the choice that made the seed's cache look useless (about 1.15x).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rigstack.atomic import write_atomic
from rigstack.client import Server
from rigstack.errors import UserError
from rigstack.offload_model import OffloadRig, cache_experts_for_budget, decode_tok_s

FORMAT = "rigstack-hot-experts/1"  # the patch's HOT_SET_FORMAT
RPC_METHOD = "expert_offload_counts"
MAX_BUDGET_GIB = 1 << 20  # 1 PiB: far above any device, and below where GiB in bytes stops being a finite float
TOP_FRACTION = 0.35  # seed 000: "the hottest 35% of the experts take 74% of the picks"


@dataclass(frozen=True)
class Trace:
    """Picks per expert of every MoE layer of one model, as the server counted them."""

    model: dict[str, Any]  # the fingerprint a hot-set file must match at boot
    expert_bytes: int
    counts: dict[str, tuple[int, ...]]  # layer name -> picks per expert

    @property
    def top_k_picks(self) -> int:
        return sum(sum(c) for c in self.counts.values())


@dataclass(frozen=True)
class LayerReport:
    name: str
    picks: int
    top_share: float  # share of the picks taken by the hottest TOP_FRACTION of the experts
    hit_rate: float  # of this layer's own hot set
    summed_hit_rate: float  # of the hot set chosen from the counts summed over layers


@dataclass(frozen=True)
class HotSetPlan:
    cache: int  # hot experts a layer
    hot: dict[str, list[int]]
    layers: list[LayerReport]

    @property
    def hit_rate(self) -> float:
        return _weighted(self.layers, "hit_rate")

    @property
    def summed_hit_rate(self) -> float:
        return _weighted(self.layers, "summed_hit_rate")


def _weighted(layers: Sequence[LayerReport], field: str) -> float:
    picks = sum(layer.picks for layer in layers)
    return sum(getattr(layer, field) * layer.picks for layer in layers) / picks if picks else 0.0


def parse_counts(payload: Any, where: str) -> Trace:
    """The answer of one worker to `expert_offload_counts`."""
    if (not isinstance(payload, dict) or payload.get("format") != FORMAT or not isinstance(payload.get("counts"), dict)
            or not isinstance(payload.get("model"), dict) or not isinstance(payload.get("expert_bytes"), int)):
        raise UserError(f"{where}: the answer is not a {FORMAT} count table; is the stack's patch 0014 applied?")
    counts = payload["counts"]
    if not counts or not all(isinstance(values, list) and values and all(_count(c) for c in values)
                             for values in counts.values()):
        raise UserError(f"{where}: the count table's layers are not lists of pick counts (whole numbers, 0 or more); "
                        "is the stack's patch 0014 applied?")
    if payload["expert_bytes"] <= 0:
        raise UserError(f"{where}: the count table gives {payload['expert_bytes']} bytes an expert; is the stack's "
                        "patch 0014 applied?")
    return Trace(payload["model"], payload["expert_bytes"], {name: tuple(values) for name, values in counts.items()})


def _count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def fetch_counts(server: Server, reset: bool = False) -> Trace:
    """The running server's pick counts (its first worker's: every TP rank routes the same tokens)."""
    where = f"{server.endpoint.base}/collective_rpc"
    results = server.collective_rpc(RPC_METHOD, "1" if reset else "0")
    if not results:
        raise UserError(f"{where}: no worker answered")
    if isinstance(results[0], str):
        raise UserError(f"{where}: the worker said {server.endpoint.redact(results[0][:200])!r}; start the server "
                        "with VLLM_EXPERT_COUNTS=1")
    # What the server sent is written into the hot-set file: a credential it echoes must not be.
    return parse_counts(server.endpoint.redact(results[0]), where)


def send_prompts(server: Server, prompts: Sequence[str], max_tokens: int) -> int:
    """Send each prompt as one greedy completion, one after another; the generated tokens they cost."""
    async def go() -> int:
        async with server.session(connections=1) as session:
            made = 0
            for prompt in prompts:
                reply = await server.request(session, "/v1/completions",
                                             {"prompt": prompt, "max_tokens": max_tokens, "temperature": 0})
                if reply.error:
                    raise UserError(f"{server.endpoint.base}: a trace prompt failed: {reply.error}")
                made += reply.tokens
            return made
    return asyncio.run(go())


def ranked(counts: Sequence[int]) -> list[int]:
    """Expert ids hottest first (ties: lower id first, so a plan is reproducible)."""
    return sorted(range(len(counts)), key=lambda e: (-counts[e], e))


def top_share(counts: Sequence[int], fraction: float = TOP_FRACTION) -> float:
    total = sum(counts)
    top = max(1, round(fraction * len(counts)))
    return sum(sorted(counts, reverse=True)[:top]) / total if total else 0.0


def hit_rate(counts: Sequence[int], hot: Sequence[int]) -> float:
    total = sum(counts)
    return sum(counts[e] for e in hot) / total if total else 0.0


def cache_for(trace: Trace, cache: int | None, budget_gib: float | None) -> int:
    """Hot experts a layer: the count given, or what the budget holds (cost model), below the layer's size."""
    experts = min(len(c) for c in trace.counts.values())
    if (cache is None) == (budget_gib is None):
        raise UserError("give exactly one of --cache (hot experts a layer) or --budget-gib (device GiB for the "
                        "caches of all layers)")
    check_budget(budget_gib)
    if cache is None:
        rig = OffloadRig(layers=len(trace.counts), experts_per_layer=experts, top_k=1,
                         expert_bytes=trace.expert_bytes, link_gb_s=1.0)
        cache = cache_experts_for_budget(rig, budget_gib * 2**30)
    if not 0 < cache < experts:
        raise UserError(f"a cache of {cache} experts a layer: the layers have {experts} experts; choose 1 to "
                        f"{experts - 1} (all of them on the device needs no offload)")
    return cache


def check_budget(budget_gib: float | None) -> None:
    if budget_gib is not None and not 0 < budget_gib <= MAX_BUDGET_GIB:  # NaN fails this too
        raise UserError(f"--budget-gib {budget_gib}: give the device GiB for the caches, above 0 and at most "
                        f"{MAX_BUDGET_GIB:,}")


def plan(trace: Trace, cache: int) -> HotSetPlan:
    """Each layer's own hottest `cache` experts, with the hit rates the trace gives them."""
    if trace.top_k_picks == 0:
        raise UserError("the server has counted no expert picks yet; send prompts first (--prompts FILE)")
    width = min(len(c) for c in trace.counts.values())
    summed = [sum(c[e] for c in trace.counts.values()) for e in range(width)]
    summed_hot = ranked(summed)[:cache]
    hot, layers = {}, []
    for name, counts in trace.counts.items():
        hot[name] = ranked(counts)[:cache]
        layers.append(LayerReport(name, sum(counts), top_share(counts), hit_rate(counts, hot[name]),
                                  hit_rate(counts, summed_hot)))
    return HotSetPlan(cache, hot, layers)


def predicted_tok_s(trace: Trace, hit: float, top_k: int, link_gb_s: float, compute_s: float) -> float:
    """The cost model's decode tokens/s at this hit rate (a prediction, not a measurement)."""
    experts = min(len(c) for c in trace.counts.values())
    rig = OffloadRig(layers=len(trace.counts), experts_per_layer=experts, top_k=top_k,
                     expert_bytes=trace.expert_bytes, link_gb_s=link_gb_s, compute_s=compute_s)
    return decode_tok_s(rig, hit)


def write_hot_sets(path: Path, trace: Trace, hot_plan: HotSetPlan) -> None:
    """The hot-set file VLLM_EXPERT_OFFLOAD reads, written whole or not at all."""
    data = {"format": FORMAT, "model": trace.model, "cache": hot_plan.cache, "layers": hot_plan.hot}
    try:
        write_atomic(path, json.dumps(data, indent=1))
    except OSError as error:
        raise UserError(f"cannot write the hot-set file {path} ({error.strerror}); give --out a path you can write "
                        "(the server keeps its counts unless --reset was given)") from None


@dataclass(frozen=True)
class TraceReport:
    """What one collection found: the trace, each layer's hot set for the cache, and the cost model's decode
    prediction (None without a link rate and top-k: it is a prediction, never a measurement)."""

    trace: Trace
    hot_plan: HotSetPlan
    prompts_sent: int
    tokens_made: int
    predicted_tok_s: tuple[float, float] | None  # (per-layer hot sets, one summed set)
    link_gb_s: float | None
    compute_ms: float


def collect(server: Server, cache: int | None, budget_gib: float | None, prompts: Sequence[str], max_tokens: int,
            reset: bool, top_k: int | None, link_gb_s: float | None, compute_ms: float) -> TraceReport:
    """Collect the server's counts (after sending `prompts`) and choose each layer's hot set."""
    check_budget(budget_gib)  # before anything is sent
    server.check_model()
    made = send_prompts(server, prompts, max_tokens) if prompts else 0
    trace = fetch_counts(server, reset=reset)
    hot_plan = plan(trace, cache_for(trace, cache, budget_gib))
    predicted = None
    if link_gb_s and top_k:
        predicted = tuple(predicted_tok_s(trace, hit, top_k, link_gb_s, compute_ms / 1e3)
                          for hit in (hot_plan.hit_rate, hot_plan.summed_hit_rate))
    return TraceReport(trace, hot_plan, len(prompts), made, predicted, link_gb_s, compute_ms)
