"""`python -m rigstack.planner --profile NAME [...]`: the plan as JSON on stdout, run by the serving interpreter
(rigstack.planner.plan_dict calls it from an interpreter without vLLM)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import typer

from rigstack.cli import run

app = typer.Typer(add_completion=False, pretty_exceptions_enable=False)


@app.command()
def main(
    profile: str = typer.Option(..., "--profile"),
    pp: int | None = typer.Option(None, "--pp"),
    tp: int | None = typer.Option(None, "--tp"),
    partition: str | None = typer.Option(None, "--partition"),
    util: float | None = typer.Option(None, "--util"),
    max_model_len: int | None = typer.Option(None, "--max-model-len"),
    max_num_seqs: int | None = typer.Option(None, "--max-num-seqs"),
    model: Path | None = typer.Option(None, "--model"),
    kv_space_gib: float | None = typer.Option(None, "--kv-space-gib"),
    memory_gib: float | None = typer.Option(None, "--memory-gib"),
    search_partition: bool = typer.Option(False, "--search-partition"),
) -> None:
    from rigstack.planner.profile_plan import plan_for

    result = plan_for(profile, pp=pp, tp=tp, partition=partition, util=util, max_model_len=max_model_len,
                      max_num_seqs=max_num_seqs, model=model, kv_space_gib=kv_space_gib, memory_gib=memory_gib,
                      search_partition=search_partition)
    json.dump(result, sys.stdout)


if __name__ == "__main__":
    sys.exit(run(app))
