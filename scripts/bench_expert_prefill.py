"""Benchmark: grouped against masked prefill of one offloaded MoE layer (patch 0014), time and bit equality, at
14, 48, 512 and 8,192-token prompts, on one CUDA GPU (tests/kernels/expert_prefill_bench.py says how). Needs torch,
triton and a GPU; no vLLM."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer

from rigstack import cli

ROOT = Path(__file__).resolve().parent.parent
# The kernel loaders live beside the kernel tests, which also run as plain scripts on a GPU host.
sys.path.insert(0, str(ROOT / "tests" / "kernels"))

app = typer.Typer(add_completion=False)


@app.command()
def main(
    tokens: Annotated[str, typer.Option(help="prompt lengths, comma-separated")] = "14,48,512,8192",
    rounds: Annotated[int, typer.Option(help="timed rounds, each running every variant once in turn")] = 5,
) -> int:
    import expert_prefill_bench  # torch and triton: only where the benchmark runs

    return expert_prefill_bench.run([int(n) for n in tokens.split(",")], rounds)


if __name__ == "__main__":
    sys.exit(cli.run(app))
