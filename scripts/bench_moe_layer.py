"""Benchmark: one offloaded MoE layer step vs the same layer all on the GPU vs the offload cost model (issue 17).

A synthetic routing trace shaped like seed 000's (Zipf within each layer, another permutation per layer) gives each
cache its hit rate; the layer (288 experts of the seed's size, top-8, one decode token a step) is timed graph-replayed
with its hot set from the trace (per layer, or from the summed counts) and its misses gathered from pinned host
memory, beside the same layer all on the GPU; the cost model (rigstack/offload_model.py) predicts each step from the
all-on-GPU step and the gather's rate measured in the same run (rigstack/bench/moe_layer.py says how).
Without a GPU it reports the trace and the hit rates only, and says so.
"""

from __future__ import annotations

import json
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Annotated

import typer

from rigstack import cli, offload_model
from rigstack.errors import UserError

app = typer.Typer(add_completion=False)

# Seed 000's margin of the per-layer cache over one chosen from the summed counts: 16.50 tok/s with 66 hot experts a
# layer, against at most 1.15x the 11.34 tok/s of the same offload without a cache.
SEED_MARGIN = 16.50 / (1.15 * 11.34)
MODEL_TOLERANCE = 0.10


def _sizes(text: str) -> list[int]:
    try:
        sizes = [int(n) for n in text.split(",")]
    except ValueError:
        raise UserError(f"--sizes {text!r}: give cache sizes as comma-separated integers, e.g. 0,54,66,128") from None
    if any(not 0 <= n < 288 for n in sizes):
        raise UserError(f"--sizes {text!r}: each cache size must be between 0 and 287 experts a layer")
    return sizes


@app.command()
def main(
    sizes: Annotated[str, typer.Option(help="cache sizes (hot experts a layer), comma-separated; 0: no cache")]
    = "0,54,66,128",
    tokens: Annotated[int, typer.Option(help="decode steps a graph (consecutive tokens of the trace)")] = 32,
    collect: Annotated[int, typer.Option(help="tokens of the collection trace the hot sets come from")] = 4000,
    held_out: Annotated[int, typer.Option(help="tokens of the held-out trace scored and timed")] = 1000,
    adaptive: Annotated[bool, typer.Option(help="also simulate adaptive LRU and LFU caches (CPU, slow)")] = True,
    reps: Annotated[int, typer.Option(help="timed replays a round")] = 3,
    rounds: Annotated[int, typer.Option(help="rounds, each timing every variant once in turn")] = 3,
    layer: Annotated[int, typer.Option(help="which layer of the trace is timed")] = 0,
    seed: Annotated[int, typer.Option(help="seed of the synthetic trace and the weights")] = 0,
    out: Annotated[Path | None, typer.Option(help="also write the figures as JSON here")] = None,
) -> int:
    cache_sizes = _sizes(sizes)  # before the imports, which take seconds
    import torch

    from rigstack.bench import moe_layer as bench  # torch and triton: only where the benchmark runs

    if not 0 <= layer < bench.LAYERS or tokens < 1 or tokens > held_out or min(collect, reps, rounds) < 1:
        raise UserError(f"need 0 <= --layer < {bench.LAYERS}, 1 <= --tokens <= --held-out, and positive --collect, "
                        "--reps and --rounds")
    traces = bench.traces(collect, held_out, seed)
    report = bench.trace_report(traces, [n for n in cache_sizes if n], adaptive)
    print(f"trace: {bench.LAYERS} layers x {bench.N_EXPERTS} experts, top-{bench.TOP_K}, Zipf exponent "
          f"{report['exponent']:.3f} (fitted on sampled picks); held-out {held_out} tokens: the hottest 35% take "
          f"{report['top_share_per_layer']:.3f} of a layer's picks, {report['top_share_summed']:.3f} of the summed "
          f"picks (summed max / mean {report['summed_max_over_mean']:.2f}); hot sets from {collect} other tokens")
    for size, rates in report["hit_rates"].items():
        print(f"  hit rate at {size:3d} hot a layer: " + ", ".join(f"{name} {rate:.3f}"
                                                                    for name, rate in rates.items()))
    figures: dict = {"trace": report}
    if not torch.cuda.is_available():
        print("layer step: not timed (no CUDA GPU here)")
    else:
        figures["layer"] = timed = bench.time_layer(traces, tokens, cache_sizes, reps, rounds, layer, seed)
        _print_layer(timed)
    if out is not None:
        out.write_text(json.dumps(figures, indent=1, default=lambda o: asdict(o)) + "\n")
    return 0


def _print_layer(timed: dict) -> None:
    measured = {m.name: m for m in timed["measured"]}
    gpu = measured["all on the GPU"]
    link = timed["link"]
    rig = offload_model.OffloadRig(layers=1, experts_per_layer=288, top_k=8, expert_bytes=timed["expert_bytes"],
                                   link_gb_s=link["gather GB/s"], compute_s=gpu.step_s)
    print(f"\nlayer step on {timed['device']} (torch {timed['torch']}), {timed['tokens']} decode tokens a graph, "
          f"expert {timed['expert_bytes']:,} B; gather {link['gather GB/s']:.2f} GB/s, contiguous copy "
          f"{link['contiguous GB/s']:.2f} GB/s ({link['gather GB/s'] / link['contiguous GB/s']:.3f})")
    print("model: step = all-on-GPU step + misses x expert bytes / gather rate (rigstack/offload_model.py)")
    print(f"  {'variant':28s} {'hit rate':>8s} {'misses/step':>11s} {'ms/step':>8s} {'(min-max)':>15s} "
          f"{'vs GPU':>7s} {'model ms':>8s} {'model err':>9s}")
    worst = 0.0
    for m in timed["measured"]:
        predicted = 1.0 / offload_model.decode_tok_s(rig, m.hit_rate)
        error = predicted / m.step_s - 1
        if m is not gpu:
            worst = max(worst, abs(error))
        print(f"  {m.name:28s} {m.hit_rate:8.3f} {m.misses / timed['tokens']:11.2f} {m.step_s * 1e3:8.3f} "
              f"({m.spread[0] * 1e3:.3f}-{m.spread[1] * 1e3:.3f}) {m.step_s / gpu.step_s:7.2f} "
              f"{predicted * 1e3:8.3f} {error:+9.1%}")
    print(f"\nmodel: worst error {worst:.1%} over the offloaded variants (goal within {MODEL_TOLERANCE:.0%})")
    for name, m in measured.items():
        if name.startswith("per-layer cache"):
            summed = measured.get(name.replace("per-layer", "summed-counts"))
            if summed is not None:
                print(f"  {name}: {summed.step_s / m.step_s:.2f}x faster than the summed-counts cache of that size "
                      f"(seed 000's margin {SEED_MARGIN:.2f}x end to end)")


if __name__ == "__main__":
    sys.exit(cli.run(app))
