"""Benchmark: a chain of consecutive offloaded MoE layers, with and without patch 0019's prefetch (issue 31).

Each layer is patch 0014's LayerOffload itself (loaded from the stack without vLLM), over its own 288 experts of the
seed's size in pinned host memory, with its own per-layer hot set from the synthetic trace of moe_layer_bench.py
(Zipf within each layer); its kernel is that module's plain torch MoE on [cache | prefetch | staging]. A decode
step runs the layers in order; the graph replays `steps` consecutive decode steps of `batch` tokens.

The prediction is set, not learned: before layer L runs, layer L+1's predicted list is overwritten with a list of
min(its true misses, prefetch slots) uncached experts of which round(accuracy x that count) are true misses of the
step and the rest experts it does not pick, so every accuracy moves the same bytes and only the hits differ (the
patch's own prediction, the previous step's picks, is what this replaces). The list goes through the layer's switch
as the patch's own guess does: while the layer's guesses miss, nothing is gathered. Every variant's outputs equal
the all-on-GPU chain's bit for bit, and the prefetch hit counters equal the hits the lists and a host replica of the
switch imply, or the run stops. The switch's state carries over from replay to replay, so the timed steps are its
steady state.

The variants: the patch's defaults (8 gather programs, break-even 0.3), the same without the switch, and the gather
at the kernel's full count without it (0019 as first measured), each group timed beside its own per-layer cache;
--prefetch-programs adds a group a count, without the switch.

It records, per variant, each layer-step's staged misses and the experts it prefetched for the next layer, so the
overlap model (rigstack/offload_model.py) can predict the step from the all-on-GPU layer and the gather's rate of
the same run; `scripts/bench_moe_chain.py` prints the table. Torch and Triton only. `--cpu` runs the same chain at
toy sizes on the CPU reference paths (no timing), which is how CI checks it.
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import sys
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

import torch

from rigstack.bench import kernel_sources
from rigstack.bench import moe_layer as mlb
from rigstack.bench.graph_timing import capture, replay_seconds

ACCURACIES = (0.0, 0.5, 0.7, 0.8, 0.9, 1.0)
CAPPED_ACCURACIES = (0.0, 0.8, 1.0)
GOAL_ACCURACY = 0.8  # issue 40's goal: the capped slot count is the model's best here
HOST_COPIES = 4


@dataclass(frozen=True)
class Shape:
    layers: int = 8
    hidden: int = mlb.HIDDEN
    inter: int = mlb.INTER
    staging: int = mlb.STAGING
    prefetch: int = 16

    @property
    def expert_bytes(self) -> int:
        return 3 * self.inter * self.hidden


@dataclass
class Point:
    name: str
    cache: int
    batch: int
    accuracy: float | None  # None: no prefetch (or all on the GPU)
    step_s: list[float] = field(default_factory=list)  # per decode step, one entry a round
    staged: list[list[int]] = field(default_factory=list)  # [step][layer] distinct experts gathered after the router
    prefetched: list[list[int]] = field(default_factory=list)  # [step][layer] experts gathered for the next layer
    hit_picks: int = 0  # picks served from a prefetch area (the device counters)
    off_steps: int = 0  # layer-steps whose area the switch left empty (the device counters)


def predictions(ids: torch.Tensor, hot: list[list[int]], slots: int, accuracy: float, n_experts: int,
                seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Predicted lists [layers, steps, slots] (ascending, -1 padded) and counts [layers, steps, 1]."""
    layers, steps = ids.shape[:2]
    gen = torch.Generator().manual_seed(seed)
    lists = torch.full((layers, steps, slots), -1, dtype=torch.int32)
    counts = torch.zeros((layers, steps, 1), dtype=torch.int32)
    for layer in range(1, layers):  # the first layer has none before it to fill its area
        cached = set(hot[layer])
        for step in range(steps):
            true = sorted(set(ids[layer, step].flatten().tolist()) - cached)
            others = [e for e in range(n_experts) if e not in cached and e not in true]
            n = min(len(true), slots)
            right = round(accuracy * n)
            pick = [true[i] for i in torch.randperm(len(true), generator=gen)[:right].tolist()]
            pick += [others[i] for i in torch.randperm(len(others), generator=gen)[:n - right].tolist()]
            lists[layer, step, :n] = torch.tensor(sorted(pick), dtype=torch.int32)
            counts[layer, step, 0] = n
    return lists, counts


def traffic(ids: torch.Tensor, hot: list[list[int]], lists: torch.Tensor | None, break_even: float = 0.0,
            decay: float = 0.5) -> tuple[list, list, int, int]:
    """Per step and layer the staged misses and the experts prefetched for the next layer, the hit picks and the
    layer-steps left unfilled; a layer's area is filled only while the decayed share of its guesses then picked is
    at least the break-even (the patch's switch, replayed on the host from a fresh state)."""
    layers, steps = ids.shape[:2]
    staged = [[0] * layers for _ in range(steps)]
    prefetched = [[0] * layers for _ in range(steps)]
    hit_picks = off_steps = 0
    # In float32, as the device judges: at a share of exactly the break-even (used 3, guessed 10) float64 and
    # float32 decide differently (0.3 rounds up in float32).
    used, guessed = torch.zeros(layers, dtype=torch.float32), torch.zeros(layers, dtype=torch.float32)
    on = [True] * layers
    for step in range(steps):
        areas = []
        for layer in range(layers):
            guess = set() if lists is None else set(lists[layer, step].tolist()) - {-1}
            areas.append(guess if on[layer] else set())
            cached = set(hot[layer])
            chosen = ids[layer, step].flatten().tolist()
            picks = [e for e in chosen if e not in cached]
            hit_picks += sum(e in areas[layer] for e in picks)
            staged[step][layer] = len(set(picks) - areas[layer])
            if lists is not None and layer > 0:  # the first layer is filled by none, so it judges nothing
                off_steps += not on[layer]
                used[layer] = used[layer] * decay + len(guess & set(chosen))
                guessed[layer] = guessed[layer] * decay + len(guess)
                on[layer] = bool(used[layer] >= guessed[layer] * break_even)
        for layer in range(layers - 1):
            prefetched[step][layer] = len(areas[layer + 1])
    return staged, prefetched, hit_picks, off_steps


def best_slots(chain: Chain, hot: list[list[int]], shape: Shape, compute_s: float, per_expert_s: float, prefetch,
               seed: int, accuracy: float = GOAL_ACCURACY) -> int:
    """The capped sweep's slot count: the one the overlap model gives the shortest step at `accuracy` on this chain's
    own routing, from this run's layer compute and gather rate. Too few slots leave misses to gather after the
    router; too many make the prefetch, wrong guesses included, outlast the compute. The model is
    rigstack/offload_model.py's overlapped_layers_s, written out here because a bench imports no library (a test
    holds the two equal)."""
    def model_s(slots: int) -> float:
        lists, _ = predictions(chain.ids, hot, slots, accuracy, mlb.N_EXPERTS, seed)
        staged, fetched, _, _ = traffic(chain.ids, hot, lists, prefetch.BREAK_EVEN, prefetch.DECAY)
        return sum(m * per_expert_s + max(compute_s, f * per_expert_s)
                   for step_staged, step_fetched in zip(staged, fetched) for m, f in zip(step_staged, step_fetched))
    return min(range(1, shape.prefetch + 1), key=model_s)  # the fewest slots among equals


def moe_batch(x: torch.Tensor, rows: torch.Tensor, ids: torch.Tensor, gates: torch.Tensor,
              shape: Shape) -> torch.Tensor:
    """moe_layer_bench's torch MoE, one token at a time (a token's picks read their experts' rows themselves)."""
    return torch.stack([mlb.moe(x[i], rows, ids[i], gates[i], shape.hidden, shape.inter) for i in range(x.shape[0])])


class Chain:
    """The inputs of one batch size: trace ids [layers, steps, batch, top_k], activations, gates, outputs."""

    def __init__(self, trace: torch.Tensor, steps: int, batch: int, shape: Shape, device: torch.device, seed: int):
        self.shape, self.device = shape, device
        self.ids = trace[:shape.layers, :steps * batch].reshape(shape.layers, steps, batch, -1).to(torch.int32)
        gen = torch.Generator().manual_seed(seed)
        self.xs = (torch.randn(shape.layers, steps, batch, shape.hidden, generator=gen) / shape.hidden ** 0.5).to(
            torch.bfloat16).to(device)
        self.gates = torch.softmax(torch.randn(*self.ids.shape, generator=gen), -1).to(device)
        self.d_ids = self.ids.to(device)
        self.out = torch.zeros(shape.layers, steps, batch, shape.hidden, dtype=torch.bfloat16, device=device)

    def gpu_steps(self, everything: list[torch.Tensor]) -> Callable[[], None]:
        def run() -> None:
            for step in range(self.ids.shape[1]):
                for layer in range(self.shape.layers):
                    self.out[layer, step] = moe_batch(self.xs[layer, step], everything[layer],
                                                      self.d_ids[layer, step], self.gates[layer, step], self.shape)
        return run

    def offloaded_steps(self, layers: list, params: list, lists: torch.Tensor | None,
                        counts: torch.Tensor | None) -> Callable[[], None]:
        d_lists = None if lists is None else lists.to(self.device)
        d_counts = None if counts is None else counts.to(self.device)

        def run() -> None:
            for step in range(self.ids.shape[1]):
                for layer, (offload, p) in enumerate(zip(layers, params)):
                    if d_lists is not None and layer + 1 < len(layers):
                        layers[layer + 1].prefetch.predict(d_lists[layer + 1, step], d_counts[layer + 1, step])

                    def apply(x, ids, w, first, p=p):  # noqa: ANN001, ANN202
                        return moe_batch(x, p["w"].data, ids, w, self.shape)
                    self.out[layer, step] = offload.forward(self.xs[layer, step], self.d_ids[layer, step],
                                                            self.gates[layer, step], apply)
        return run


def build_layers(eo, hosts: list[torch.Tensor], hot: list[list[int]], shape: Shape, prefetch: int,
                 device: torch.device, programs: int | None = None, break_even: float = 0.0) -> tuple[list, list]:
    """The chain's layers; `programs` None: the prefetch gather at the kernel's full count."""
    layers, params = [], []
    for i, host in enumerate(hosts):
        p = {"w": torch.nn.Parameter(host, requires_grad=False)}
        layers.append(eo.expert_offload.LayerOffload(p, hot[i], len(hot[i]), shape.staging, device, 1 << 30, False,
                                                     f"layers.{i}", prefetch, programs, break_even))
        params.append(p)
    if prefetch:
        eo.expert_prefetch.link(layers, device)
    return layers, params


def _once(run: Callable[[], None], graph: torch.cuda.CUDAGraph | None) -> None:
    if graph is None:
        run()
    else:
        graph.replay()
        torch.cuda.synchronize()


def bench(sizes: list[int], batches: list[int], steps: int, shape: Shape, rounds: int, reps: int, seed: int,
          device: torch.device, programs: tuple[int, ...] = (), say: Callable[[Point], None] = lambda p: None,
          save: Callable[[dict], None] = lambda report: None) -> dict:
    """The report; `say` gets each point as it is timed, `save` the report so far after each group of variants."""
    on_gpu = device.type == "cuda"
    eo = kernel_sources.load_expert_offload(interpret=not on_gpu)
    t = mlb.traces(4000, max(batches) * steps + 1, seed)
    counts = mlb.pick_counts(t.collect)
    hosts, everything = _experts(shape, seed, device)
    link = mlb._link_rates(eo.expert_offload_kernels, hosts[0], reps, rounds) if on_gpu else {}
    per_expert_s = shape.expert_bytes / (link["gather GB/s"] * 1e9) if on_gpu else 0.0
    points: list[Point] = []

    def report() -> dict:
        return _report(on_gpu, shape, steps, link, per_expert_s, points)
    for batch in batches:
        chain = Chain(t.held_out, steps, batch, shape, device, seed)
        gpu = Point("all on the GPU", mlb.N_EXPERTS, batch, None)
        run_gpu = chain.gpu_steps(everything)
        run_gpu()
        reference = chain.out.clone()
        if on_gpu:
            _time([(gpu, capture(run_gpu), run_gpu)], rounds, reps, steps)
        points.append(gpu)
        say(gpu)
        for size in sizes:
            hot = [h.tolist() for h in mlb.per_layer_hot(counts, size)[:shape.layers]]
            cap = best_slots(chain, hot, shape, statistics.median(gpu.step_s) / shape.layers, per_expert_s,
                             eo.expert_prefetch, seed) if on_gpu else 2
            plain = build_layers(eo, hosts, hot, shape, 0, device)
            # Each group beside its own per-layer cache, one group's layers alive at a time (every set of layers
            # holds its own cache and staging: more than three at once do not fit an 80 GB card at 66 hot).
            for group, sweeps in _groups(eo.expert_prefetch, (shape.prefetch, cap), programs):
                variants = [(Point(f"per-layer cache {size}{group}", size, batch, None),
                             chain.offloaded_steps(*plain, None, None), None)]
                checked = _check(variants, [], chain, hot, reference, on_gpu, (0.0, eo.expert_prefetch.DECAY))
                for slots, accuracies, n_programs, break_even in sweeps:
                    fetching = build_layers(eo, hosts, hot, shape, slots, device, n_programs, break_even)
                    variants = []
                    for accuracy in accuracies:
                        lists, lcounts = predictions(chain.ids, hot, slots, accuracy, mlb.N_EXPERTS, seed)
                        variants.append((Point(f"prefetch {slots} {size} @ {accuracy:.1f}{group}", size, batch,
                                               accuracy), chain.offloaded_steps(*fetching, lists, lcounts), lists))
                    checked += _check(variants, fetching[0], chain, hot, reference, on_gpu,
                                      (break_even, eo.expert_prefetch.DECAY))
                if on_gpu:
                    _time(checked, rounds, reps, steps)
                for point, *_ in checked:
                    points.append(point)
                    say(point)
                save(report())  # a run cut by a time limit keeps every group it finished
                del fetching, checked, variants
                gc.collect()  # device memory held in reference cycles goes back before the cache is emptied
                if on_gpu:
                    torch.cuda.empty_cache()
            del plain
    return report()


def _experts(shape: Shape, seed: int, device: torch.device) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """Each layer's experts in host memory (pinned on CUDA) and on the device. Four distinct host copies, layer i on
    copy i % 4: a copy's lines are long out of L2 when the layer 4 on reads it, and it halves the pinned memory of 8
    layers (31 GiB)."""
    distinct = [mlb.host_experts(mlb.N_EXPERTS, shape.expert_bytes, seed + i, pin=device.type == "cuda")
                for i in range(min(HOST_COPIES, shape.layers))]
    on_device = [h.to(device) for h in distinct]
    return ([distinct[i % len(distinct)] for i in range(shape.layers)],
            [on_device[i % len(distinct)] for i in range(shape.layers)])


def _report(on_gpu: bool, shape: Shape, steps: int, link: dict, per_expert_s: float, points: list[Point]) -> dict:
    return {"device": torch.cuda.get_device_name() if on_gpu else "cpu", "torch": torch.__version__,
            "shape": asdict(shape), "steps": steps, "expert_bytes": shape.expert_bytes, "link": link,
            "per_expert_s": per_expert_s, "points": [asdict(p) for p in points]}


def _groups(prefetch, slot_counts: tuple[int, int], programs: tuple[int, ...]) -> list[tuple[str, list]]:
    """(label, [(slots, accuracies, gather programs, break-even)]): the patch's defaults, the same without the switch,
    the gather at the kernel's full count (None) without it, and each --prefetch-programs count without it."""
    ours = (prefetch.PROGRAMS, prefetch.BREAK_EVEN)
    configs = [("", ours, ACCURACIES), (" no switch", (ours[0], 0.0), CAPPED_ACCURACIES),
               (" full gather", (None, 0.0), CAPPED_ACCURACIES),
               *((f" p{n}", (n, 0.0), CAPPED_ACCURACIES) for n in programs)]
    return [(label, [(slots, accuracies, *config) for slots in slot_counts]) for label, config, accuracies in configs]


def _check(variants: list, fetching: list, chain: Chain, hot: list[list[int]], reference: torch.Tensor,
           on_gpu: bool, switch: tuple[float, float]) -> list:
    """Capture each variant (on CUDA), run it once from a fresh switch, and stop unless it equals the all-on-GPU
    chain and its prefetch counters show the hits its lists and the switch (break-even, decay) imply."""
    done = []
    for point, run, lists in variants:
        graph = capture(run) if on_gpu else None
        for layer in fetching:
            layer.prefetch.restart()
        chain.out.fill_(float("nan"))
        _once(run, graph)
        if not torch.equal(chain.out, reference):
            raise SystemExit(f"{point.name}, batch {point.batch}: the chain's outputs differ from the all-on-GPU one")
        point.staged, point.prefetched, point.hit_picks, point.off_steps = traffic(chain.ids, hot, lists, *switch)
        counted = [sum(int(getattr(layer.prefetch, name)) for layer in fetching) if lists is not None else 0
                   for name in ("hits", "off_steps")]
        if counted != [point.hit_picks, point.off_steps]:
            raise SystemExit(f"{point.name}, batch {point.batch}: the prefetch counters say {counted[0]} hit picks "
                             f"and {counted[1]} unfilled layer-steps, the lists and the switch imply "
                             f"{point.hit_picks} and {point.off_steps}")
        done.append((point, graph, run))  # the run's closure keeps the layers the graph reads alive
    return done


def _time(timed: list, rounds: int, reps: int, steps: int) -> None:
    for _ in range(rounds):  # every variant in turn, so a drift of the link shows on all of them
        for point, graph, *_ in timed:
            point.step_s.append(replay_seconds(graph, reps) / steps)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cpu", action="store_true", help="toy sizes on the CPU reference paths, no timing")
    parser.add_argument("--sizes", default="54,66,128")
    parser.add_argument("--batches", default="1,4")
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--prefetch-programs", default="",
                        help="also time the prefetch gather at these Triton program counts, e.g. 8,16,32,64")
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    shape = Shape(hidden=32, inter=8) if args.cpu else Shape()
    device = torch.device("cpu" if args.cpu else "cuda")

    def save(report: dict) -> None:
        with open(args.out, "w") as f:
            json.dump(report, f, indent=1)
    save(bench([int(n) for n in args.sizes.split(",")], [int(n) for n in args.batches.split(",")], args.steps,
               shape, args.rounds, args.reps, args.seed, device,
               tuple(int(n) for n in args.prefetch_programs.split(",") if n), _say, save))
    return 0


def _say(p: Point) -> None:
    """A line per point as soon as it is timed, so a run cut short still shows what it measured."""
    median = f"{statistics.median(p.step_s) * 1e3:.3f} ms" if p.step_s else "not timed"
    print(f"batch {p.batch} {p.name:24s} {median}  hit picks {p.hit_picks}", flush=True)


if __name__ == "__main__":
    sys.exit(main())
