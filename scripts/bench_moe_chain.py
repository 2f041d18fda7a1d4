"""Benchmark: a chain of offloaded MoE layers with and without patch 0019's prefetch vs the overlap cost model.

Runs rigstack/bench/moe_chain.py where a CUDA GPU is (or reads the JSON it wrote, --from-json) and prints each
point's step beside the prediction of rigstack/offload_model.py's overlap model, fed the all-on-GPU layer and the
gather's rate measured in the same run and each point's own staged and prefetched experts.
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path
from typing import Annotated

import typer

from rigstack import cli, offload_model
from rigstack.errors import UserError


app = typer.Typer(add_completion=False)


def predicted_s(report: dict, point: dict, gpu_step_s: float) -> float:
    """The overlap model's step for one point: every step's layers, with the all-on-GPU layer as their compute."""
    layers = report["shape"]["layers"]
    steps = [offload_model.overlapped_layers_s(gpu_step_s / layers, report["per_expert_s"], staged, fetched)
             for staged, fetched in zip(point["staged"], point["prefetched"])]
    return statistics.mean(steps)


def table(report: dict) -> list[str]:
    """One line a point: measured ms a step, the speed-up over the same cache without prefetch, model ms, error."""
    lines = [f"{report['device']} (torch {report['torch']}), {report['shape']['layers']} layers, "
             f"{report['steps']} decode steps a graph, expert {report['expert_bytes']:,} B, gather "
             f"{report['link']['gather GB/s']:.2f} GB/s (contiguous copy {report['link']['contiguous GB/s']:.2f})",
             f"{'batch':>5s} {'variant':28s} {'ms/step':>8s} {'vs none':>7s} {'model ms':>8s} {'error':>7s}"]
    gpu = {p["batch"]: statistics.median(p["step_s"]) for p in report["points"] if p["name"] == "all on the GPU"}
    plain: dict[tuple[int, int], float] = {}
    for p in report["points"]:
        measured = statistics.median(p["step_s"])
        if p["name"].startswith("per-layer cache"):
            plain[p["batch"], p["cache"]] = measured
        model = predicted_s(report, p, gpu[p["batch"]]) if p["name"] != "all on the GPU" else gpu[p["batch"]]
        base = plain.get((p["batch"], p["cache"]))
        ratio = f"{base / measured:7.3f}" if base and p["name"] != "all on the GPU" else f"{'':7s}"
        lines.append(f"{p['batch']:5d} {p['name']:28s} {measured * 1e3:8.3f} {ratio} {model * 1e3:8.3f} "
                     f"{model / measured - 1:+7.1%}")
    return lines


@app.command()
def main(
    from_json: Annotated[Path | None, typer.Option(help="print the table of a JSON the bench wrote")] = None,
    out: Annotated[Path, typer.Option(help="where the bench writes its JSON")] = Path("moe_chain.json"),
) -> int:
    if from_json is None:
        import torch

        if not torch.cuda.is_available():
            raise UserError("no CUDA GPU here: run the bench on one (rigstack/bench/moe_chain.py), then "
                            "--from-json its output")
        from rigstack.bench import moe_chain  # torch and triton: only where the benchmark runs

        moe_chain.main(["--out", str(out)])
        from_json = out
    try:
        report = json.loads(from_json.read_text())
    except (OSError, json.JSONDecodeError) as error:
        raise UserError(f"--from-json {from_json}: cannot read the bench's JSON ({error})") from None
    print("\n".join(table(report)))
    return 0


if __name__ == "__main__":
    sys.exit(cli.run(app))
