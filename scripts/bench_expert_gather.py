"""Benchmark: the expert-offload miss gather (patch 0013) against a contiguous pinned-host copy, on one CUDA GPU.

For 8 to 64 misses a step, graph-replayed: a contiguous copy-engine copy (the denominator), per-expert copies (ids
on the CPU), index_select on the zero-copy view, the Triton gather with a sweep of its tile shapes, the same kernel
over one contiguous range (the SM-read ceiling) and copy-engine gathers driven by conditional graph nodes; GB/s and
each one's fraction of contiguous (rigstack/bench/expert_gather.py says how). Needs torch, triton and a GPU.
"""

from __future__ import annotations

import sys
from typing import Annotated

import typer

from rigstack import cli


app = typer.Typer(add_completion=False)


@app.command()
def main(
    misses: Annotated[str, typer.Option(help="missed experts a step, comma-separated (1 to 64)")] = "8,16,32,64",
    reps: Annotated[int, typer.Option(help="timed replays a round")] = 3,
    rounds: Annotated[int, typer.Option(help="rounds, each timing every variant once in turn")] = 5,
    sweep: Annotated[bool, typer.Option(help="also time the gather's other tile shapes")] = True,
    conditional: Annotated[bool, typer.Option(help="also time the copy-engine gathers of conditional graph nodes "
                                                   "(needs cuda.bindings; 4 GiB more GPU memory)")] = True,
) -> int:
    from rigstack.bench import expert_gather  # torch and triton: only where the benchmark runs

    return expert_gather.run([int(n) for n in misses.split(",")], reps, rounds, sweep, conditional)


if __name__ == "__main__":
    sys.exit(cli.run(app))
