"""Benchmark: the SM8x sparse-MLA decode kernel (patch 0009) against plain torch, on one CUDA GPU, and the paged
indexer logits (patch 0010); rigstack/bench/sparse_mla.py says what is measured and how. Needs torch, triton and a
GPU; no vLLM.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer

from rigstack import cli

app = typer.Typer(add_completion=False)


@app.command()
def main(
    batches: Annotated[str, typer.Option(help="decode batch sizes, comma-separated")] = "1,8,32,64",
    heads: Annotated[int, typer.Option(help="attention heads on the GPU")] = 64,
    topk: Annotated[int, typer.Option(help="selected rows per token")] = 2048,
    pool_rows: Annotated[int, typer.Option(help="KV pool rows (3.4M = 2.2 GB, past 2**31 bytes)")] = 3_400_000,
    sweep: Annotated[bool, typer.Option(help="also time block shapes and split counts")] = False,
    indexer: Annotated[bool, typer.Option(help="also time the paged indexer logits (patch 0010)")] = True,
    json_out: Annotated[Path | None, typer.Option(help="write the figures here as JSON")] = None,
) -> int:
    from rigstack.bench.sparse_mla import run_bench  # torch and triton: only where the benchmark runs

    return run_bench([int(b) for b in batches.split(",")], heads, topk, pool_rows, sweep, indexer, json_out)


if __name__ == "__main__":
    sys.exit(cli.run(app))
