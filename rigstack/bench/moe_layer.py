"""Benchmark: one offloaded MoE layer step against the same layer all on the GPU, at the hit rates of a routing trace.

The trace is synthetic, shaped like seed 000's: per layer the experts' pick shares follow a Zipf law whose exponent
makes the hottest 35% take 74% of the picks (top-k picks a token, drawn without replacement), and each layer ranks
its experts by its own random permutation, so that summed over the layers the counts look flat. From a collection
trace it chooses each layer's hot set (the per-layer cache) and one hot set from the summed counts (what a cache
blind to layers gets), and scores them, an oracle (the per-layer top-k of the evaluated trace itself) and two
adaptive caches (LRU, LFU) on a second, held-out trace.

The layer step (decode, one token, top-8 of 288 experts of the seed's size: 13.53 MB as fp8 gate/up/down weights,
hidden 4096): remap the top-k ids to [cache | staging] slots (patch 0013's remap_topk), gather the misses from
pinned host memory into the staging slots (gather_misses), then a plain torch MoE on the [cache | staging] rows with
the remapped ids. The all-on-GPU layer runs the same torch MoE on all 288 experts in device memory with the raw ids.
Everything is captured in a CUDA graph of consecutive trace tokens and replayed; no host sync inside a step.
Torch and Triton only; `scripts/bench_moe_layer.py` is its command and adds the cost model's prediction.
"""

from __future__ import annotations

import statistics
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType

import torch

from rigstack.bench.graph_timing import capture, replay_gbps, replay_seconds

GIB = 1 << 30
N_EXPERTS = 288
TOP_K = 8
LAYERS = 45
STAGING = 64
HIDDEN = 4096
EXPERT_BYTES_EXACT = 163.3 * GIB / (LAYERS * N_EXPERTS)  # the seed's expert: 13,529,478 B
INTER = int(EXPERT_BYTES_EXACT) // (3 * HIDDEN)  # 1101: fp8 gate, up [INTER, HIDDEN] and down [HIDDEN, INTER]
TOP_FRACTION, TOP_SHARE = 0.35, 0.74  # seed 000: per layer the hottest 35% of the experts take 74% of the picks


# --- the routing trace (CPU) ----------------------------------------------------------------------------------------

def routing_trace(tokens: int, exponent: float, seed: int, layers: int = LAYERS, n_experts: int = N_EXPERTS,
                  top_k: int = TOP_K, perms: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(trace [layers, tokens, top_k] int64 expert ids, perms [layers, n_experts]): token t of layer l picks top_k
    distinct experts, rank r drawn with weight (r + 1) ** -exponent and mapped through the layer's permutation.
    Pass the perms of one trace to draw another (held-out) trace of the same model."""
    gen = torch.Generator().manual_seed(seed)
    if perms is None:
        perms = torch.stack([torch.randperm(n_experts, generator=gen) for _ in range(layers)])
    weights = torch.arange(1, n_experts + 1, dtype=torch.float64) ** -exponent
    ranks = torch.multinomial(weights.expand(layers * tokens, n_experts), top_k, generator=gen)
    trace = torch.gather(perms, 1, ranks.view(layers, tokens * top_k)).view(layers, tokens, top_k)
    return trace, perms


def pick_counts(trace: torch.Tensor, n_experts: int = N_EXPERTS) -> torch.Tensor:
    """[layers, n_experts] picks of each expert."""
    layers = trace.shape[0]
    offsets = torch.arange(layers).view(layers, 1, 1) * n_experts
    return torch.bincount((trace + offsets).flatten(), minlength=layers * n_experts).view(layers, n_experts)


def top_share(counts: torch.Tensor, fraction: float = TOP_FRACTION) -> torch.Tensor:
    """Per row of counts, the share of the picks the hottest `fraction` of the experts take."""
    top = round(fraction * counts.shape[-1])
    return counts.sort(dim=-1, descending=True).values[..., :top].sum(-1) / counts.sum(-1)


def fit_exponent(share: float = TOP_SHARE, fraction: float = TOP_FRACTION, tokens: int = 2000, seed: int = 0,
                 top_k: int = TOP_K) -> float:
    """The Zipf exponent at which a sampled trace's layers have the hottest `fraction` take `share` of the picks
    (drawing top_k without replacement flattens the head, so the single-draw fit is not it). Bisection on one
    layer's sampled counts, with the same seed at every step so the share grows monotonically with the exponent."""
    lo, hi = 0.0, 4.0
    for _ in range(20):
        mid = (lo + hi) / 2
        trace, _ = routing_trace(tokens, mid, seed, layers=1, top_k=top_k)
        lo, hi = (mid, hi) if float(top_share(pick_counts(trace))[0]) < share else (lo, mid)
    return (lo + hi) / 2


def per_layer_hot(counts: torch.Tensor, size: int) -> torch.Tensor:
    """[layers, size]: each layer's most-picked experts (the per-layer cache)."""
    return counts.topk(size, dim=1).indices


def summed_hot(counts: torch.Tensor, size: int) -> torch.Tensor:
    """[layers, size]: the experts most picked summed over the layers, the same set in every layer."""
    return counts.sum(0).topk(size).indices.expand(counts.shape[0], size)


def hit_rate(trace: torch.Tensor, hot: torch.Tensor, n_experts: int = N_EXPERTS) -> float:
    """Share of the trace's picks that land on their layer's hot set."""
    member = torch.zeros(trace.shape[0], n_experts, dtype=torch.bool)
    member.scatter_(1, hot, True)
    return float(torch.gather(member, 1, trace.flatten(1)).float().mean())


def adaptive_hit_rate(trace: torch.Tensor, size: int, policy: str) -> float:
    """Hit rate of a per-layer cache of `size` experts that adapts as the tokens come, starting empty: "lru" evicts
    the least recently picked, "lfu" the least often picked so far (counts kept for every expert, ties by recency).
    A step's picks are all looked up (and its hits refreshed) before its misses are inserted, as a step's misses
    are staged together; a miss evicts the least recent (LRU) or least counted (LFU, ties by recency) entry."""
    if policy not in ("lru", "lfu") or size < 1:
        raise ValueError(f"adaptive_hit_rate: policy {policy!r} (lru or lfu) with size {size} (at least 1)")
    hits = total = 0
    for layer in trace.tolist():
        cache: OrderedDict[int, None] = OrderedDict()
        seen: dict[int, int] = {}
        for picks in layer:
            missed = []
            for e in picks:
                total += 1
                seen[e] = seen.get(e, 0) + 1
                if e in cache:
                    hits += 1
                    cache.move_to_end(e)
                else:
                    missed.append(e)
            for e in missed:
                if len(cache) >= size:
                    victim = next(iter(cache)) if policy == "lru" else min(cache, key=seen.__getitem__)
                    del cache[victim]
                cache[e] = None
    return hits / total


# --- the layer step (CPU or CUDA) -----------------------------------------------------------------------------------

def host_experts(n_experts: int, expert_bytes: int, seed: int, pin: bool) -> torch.Tensor:
    """[n_experts, expert_bytes] uint8 of random fp8 e4m3 values with no NaN (bit 6 clear: |w| < 2); drawn on the
    GPU where the rows are pinned for one (gigabytes: the CPU's generator takes tens of seconds)."""
    host = torch.empty((n_experts, expert_bytes), dtype=torch.uint8, pin_memory=pin)
    device = "cuda" if pin else "cpu"
    gen = torch.Generator(device).manual_seed(seed)
    for row in range(n_experts):
        host[row].copy_(torch.randint(0, 256, (expert_bytes,), dtype=torch.uint8, device=device, generator=gen)
                        .bitwise_and_(0xBF))
    return host


def moe(x: torch.Tensor, rows: torch.Tensor, ids: torch.Tensor, gates: torch.Tensor, hidden: int,
        inter: int) -> torch.Tensor:
    """A plain torch MoE for one token: sum over picks k of gates[k] * down_k(silu(gate_k x) * up_k x), expert k's
    fp8 weights being rows[ids[k]]. An id of -1 (a miss with no staging slot) contributes nothing, as in vLLM."""
    valid = ids >= 0
    # The rows picked, copied as 8-byte words where the row allows: as bytes, index_select's speed depends on
    # whether the source passes 2**31 elements (32- or 64-bit indexing), which a cache's size then decides.
    wide = rows.view(torch.int64) if rows.shape[1] % 8 == 0 else rows
    w = wide.index_select(0, torch.where(valid, ids, 0).long()).view(torch.uint8).view(torch.float8_e4m3fn)
    gate_up = w[:, :2 * inter * hidden].view(-1, 2 * inter, hidden).to(x.dtype)
    down = w[:, 2 * inter * hidden:3 * inter * hidden].view(-1, hidden, inter).to(x.dtype)
    h = torch.bmm(gate_up, x.expand(ids.numel(), hidden).unsqueeze(2)).squeeze(2)  # [k, 2 * inter]
    a = torch.nn.functional.silu(h[:, :inter]) * h[:, inter:]
    y = torch.bmm(down, a.unsqueeze(2)).squeeze(2)  # [k, hidden]
    return (y * (gates * valid).unsqueeze(1).to(y.dtype)).sum(0)


@dataclass
class OffloadedLayer:
    """One MoE layer with its experts in host memory: `rows` is [cache | staging] on the device."""

    src: torch.Tensor  # what the gather reads: the zero-copy view of the pinned host rows on CUDA, the rows on CPU
    rows: torch.Tensor  # [n_cache + staging, expert_bytes] uint8
    slot_of_expert: torch.Tensor  # [n_experts] int32
    n_cache: int
    staging: int
    scratch: tuple[torch.Tensor, ...]  # remap outputs, preallocated (graph capture)


def offloaded_layer(ko: ModuleType, host: torch.Tensor, hot: list[int], staging: int,
                    device: torch.device) -> OffloadedLayer:
    """The cache filled with the `hot` experts' rows (slot i holds hot[i]), an empty staging area after it."""
    n_experts, expert_bytes = host.shape
    src = ko.host_view_on_device(host) if device.type == "cuda" else host
    rows = torch.empty((len(hot) + staging, expert_bytes), dtype=torch.uint8, device=device)
    slot_of_expert = torch.full((n_experts,), -1, dtype=torch.int32)
    if hot:
        index = torch.tensor(hot, dtype=torch.long)
        slot_of_expert[index] = torch.arange(len(hot), dtype=torch.int32)
        rows[:len(hot)].copy_(host[index].to(device))
    ko.check_slot_map(slot_of_expert, len(hot))
    scratch = (torch.empty((1, TOP_K), dtype=torch.int32, device=device),
               torch.empty(staging, dtype=torch.int32, device=device), torch.empty(1, dtype=torch.int32, device=device),
               torch.empty(n_experts, dtype=torch.int32, device=device))
    return OffloadedLayer(src, rows, slot_of_expert.to(device), len(hot), staging, scratch)


def offloaded_step(ko: ModuleType, layer: OffloadedLayer, x: torch.Tensor, ids: torch.Tensor, gates: torch.Tensor,
                   hidden: int = HIDDEN, inter: int = INTER) -> torch.Tensor:
    """Remap, gather the misses into the staging rows, MoE on [cache | staging]: no host sync."""
    remapped, miss_list, miss_count = ko.remap_topk(ids.view(1, -1), layer.slot_of_expert, layer.n_cache,
                                                    layer.staging, out=layer.scratch)
    ko.gather_misses(layer.src, miss_list, miss_count, layer.rows[layer.n_cache:])
    return moe(x, layer.rows, remapped.view(-1), gates, hidden, inter)


def misses(ids: torch.Tensor, hot: list[int]) -> int:
    """Distinct experts of a step (ids [tokens, top_k]) outside the hot set: what crosses the link."""
    return len(set(ids.flatten().tolist()) - set(hot))


# --- timing (CUDA) --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Measured:
    name: str
    hot: int  # cache size
    hit_rate: float  # over the timed tokens' picks
    misses: int  # distinct missed experts summed over the timed steps
    step_s: float  # median per step (graph replay / steps)
    spread: tuple[float, float]  # min, max per-step of the rounds


@dataclass(frozen=True)
class Traces:
    exponent: float
    collect: torch.Tensor  # [layers, tokens, top_k]: the hot sets are chosen from its counts
    held_out: torch.Tensor  # the same model's routing, other tokens: scored and timed


def traces(collect_tokens: int, eval_tokens: int, seed: int) -> Traces:
    exponent = fit_exponent(seed=seed)
    collect, perms = routing_trace(collect_tokens, exponent, seed)
    held_out, _ = routing_trace(eval_tokens, exponent, seed + 1, perms=perms)
    return Traces(exponent, collect, held_out)


def trace_report(t: Traces, sizes: list[int], adaptive: bool = True) -> dict:
    """How concentrated the picks are per layer and summed, and each cache's hit rate on the held-out trace."""
    counts, held = pick_counts(t.collect), pick_counts(t.held_out)
    summed = held.sum(0).float()
    rates = {}
    for size in sizes:
        rates[size] = {"per-layer cache": hit_rate(t.held_out, per_layer_hot(counts, size)),
                       "oracle per-layer top-k": hit_rate(t.held_out, per_layer_hot(held, size)),
                       "summed-counts cache": hit_rate(t.held_out, summed_hot(counts, size))}
        if adaptive:
            rates[size] |= {f"adaptive {policy.upper()}": adaptive_hit_rate(t.held_out, size, policy)
                            for policy in ("lru", "lfu")}
    return {"exponent": t.exponent, "top_share_per_layer": float(top_share(held).mean()),
            "top_share_summed": float(top_share(held.sum(0, keepdim=True))[0]),
            "summed_max_over_mean": float(summed.max() / summed.mean()), "hit_rates": rates}


def time_layer(t: Traces, tokens: int, sizes: list[int], reps: int, rounds: int, layer: int, seed: int) -> dict:
    """Layer step timings on the GPU, as data (the command prints them with the cost model's prediction)."""
    from rigstack.bench import kernel_sources

    counts = pick_counts(t.collect)
    held_out = t.held_out
    ko = kernel_sources.load_module("vllm/model_executor/layers/fused_moe/expert_offload_kernels.py")
    device = torch.device("cuda")
    expert_bytes = 3 * INTER * HIDDEN
    host = host_experts(N_EXPERTS, expert_bytes, seed, pin=True)
    everything = host.to(device)
    ids = held_out[layer, :tokens].to(torch.int32)  # [tokens, top_k] of the timed layer
    d_ids = ids.to(device)
    gen = torch.Generator().manual_seed(seed)
    xs = (torch.randn(tokens, HIDDEN, generator=gen) / HIDDEN ** 0.5).to(torch.bfloat16).to(device)
    gates = torch.softmax(torch.randn(tokens, TOP_K, generator=gen), 1).to(device)
    out = torch.empty(tokens, HIDDEN, dtype=torch.bfloat16, device=device)

    def gpu_steps() -> None:
        for i in range(tokens):
            out[i] = moe(xs[i], everything, d_ids[i], gates[i], HIDDEN, INTER)

    # name -> (cache size, hot set, the graph's steps)
    variants: dict[str, tuple[int, list[int], Callable[[], None]]] = {
        "all on the GPU": (N_EXPERTS, list(range(N_EXPERTS)), gpu_steps)}
    for size in sizes:
        for name, hot_sets in (("per-layer cache", per_layer_hot(counts, size)),
                               ("summed-counts cache", summed_hot(counts, size))):
            if name == "summed-counts cache" and size == 0:
                continue  # the same empty cache
            hot = hot_sets[layer].tolist()
            offloaded = offloaded_layer(ko, host, hot, STAGING, device)

            def steps(offloaded: OffloadedLayer = offloaded) -> None:
                for i in range(tokens):
                    out[i] = offloaded_step(ko, offloaded, xs[i], d_ids[i], gates[i])
            variants[f"{name} {size}" if size else "no cache (all misses)"] = (size, hot, steps)
    graphs = _checked_graphs(variants, out)
    times: dict[str, list[float]] = {name: [] for name in graphs}
    for _ in range(rounds):  # every variant in turn, so a drift of the link shows on all of them
        for name, graph in graphs.items():
            times[name].append(replay_seconds(graph, reps) / tokens)
    # The gather alone at 8 misses a step, and a contiguous copy of the same bytes, for the model's link rate.
    link = _link_rates(ko, host, reps, rounds)
    return {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "tokens": tokens,
            "expert_bytes": expert_bytes, "link": link, "measured": _measured(variants, times, ids)}


def _checked_graphs(variants: dict[str, tuple[int, list[int], Callable[[], None]]],
                    out: torch.Tensor) -> dict[str, torch.cuda.CUDAGraph]:
    """Each variant's steps captured; bit for bit, every offloaded variant computes the all-on-GPU layer's outputs."""
    reference = None
    graphs = {}
    for name, (_, _, steps) in variants.items():
        out.fill_(float("nan"))
        graphs[name] = capture(steps)
        graphs[name].replay()
        torch.cuda.synchronize()
        if reference is None:
            reference = out.clone()
        elif not torch.equal(out, reference):
            raise SystemExit(f"{name}: the offloaded layer's outputs differ from the all-on-GPU layer's")
    return graphs


def _measured(variants: dict[str, tuple[int, list[int], Callable[[], None]]], times: dict[str, list[float]],
              ids: torch.Tensor) -> list[Measured]:
    """Each variant's hit rate and misses on the timed tokens, beside its step time."""
    measured = []
    for name, (size, hot, _) in variants.items():
        members = set(hot)
        hits = sum(e in members for e in ids.flatten().tolist())
        n_miss = sum(misses(ids[i:i + 1], hot) for i in range(ids.shape[0]))
        measured.append(Measured(name, size, hits / ids.numel(), n_miss, statistics.median(times[name]),
                                 (min(times[name]), max(times[name]))))
    return measured


def _link_rates(ko: ModuleType, host: torch.Tensor, reps: int, rounds: int) -> dict[str, float]:
    """GB/s of the gather (8 random misses a step, 4 steps a graph) and of a contiguous copy of the same bytes."""
    n, steps = TOP_K, 4
    view = ko.host_view_on_device(host)
    dst = torch.empty((STAGING, host.shape[1]), dtype=torch.uint8, device="cuda")
    gen = torch.Generator().manual_seed(1)
    lists = torch.full((steps, STAGING), -1, dtype=torch.int32)
    lists[:, :n] = torch.randperm(N_EXPERTS, generator=gen)[:steps * n].view(steps, n).sort(1).values.to(torch.int32)
    d_lists, d_count = lists.cuda(), torch.full((1,), n, dtype=torch.int32, device="cuda")

    def gather() -> None:
        for i in range(steps):
            ko.gather_misses(view, d_lists[i], d_count, dst)

    def contiguous() -> None:
        for i in range(steps):
            dst[:n].copy_(host[i * n:(i + 1) * n], non_blocking=True)
    graphs = {"gather": capture(gather), "contiguous": capture(contiguous)}
    nbytes = steps * n * host.shape[1]
    speed: dict[str, list[float]] = {name: [] for name in graphs}
    for _ in range(rounds):
        for name, graph in graphs.items():
            speed[name].append(replay_gbps(graph, nbytes, reps))
    return {f"{name} GB/s": statistics.median(values) for name, values in speed.items()}
