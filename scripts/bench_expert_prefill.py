"""Benchmark: grouped against masked prefill of one offloaded MoE layer (patch 0014), time and bit equality, at
14, 48, 512 and 8,192-token prompts, on one CUDA GPU (rigstack/bench/expert_prefill.py says how). Needs torch,
triton and a GPU; no vLLM."""

from __future__ import annotations

import sys
from typing import Annotated

import typer

from rigstack import cli

app = typer.Typer(add_completion=False)


@app.command()
def main(
    tokens: Annotated[str, typer.Option(help="prompt lengths, comma-separated")] = "14,48,512,8192",
    rounds: Annotated[int, typer.Option(help="timed rounds, each running every variant once in turn")] = 5,
) -> int:
    from rigstack.bench import expert_prefill  # torch and triton: only where the benchmark runs

    return expert_prefill.run([int(n) for n in tokens.split(",")], rounds)


if __name__ == "__main__":
    sys.exit(cli.run(app))
