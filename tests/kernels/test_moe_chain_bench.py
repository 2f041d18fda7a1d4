"""The chain bench of issue 31 (rigstack/bench/moe_chain.py) in its CPU mode: 0014's LayerOffload layers with
0019's prefetch at toy sizes equal the all-on-device chain bit for bit (the bench stops otherwise), and the device
hit counters follow the set accuracy: none at 0, the most at 1, none for the chain without prefetch."""

from __future__ import annotations

import json
from pathlib import Path

from rigstack.bench import moe_chain as bench


def test_the_cpu_chain_runs_checks_and_counts_its_hits(tmp_path: Path) -> None:
    out = tmp_path / "chain.json"
    assert bench.main(["--cpu", "--sizes", "66", "--batches", "1,4", "--steps", "2", "--out", str(out)]) == 0
    points = {(p["batch"], p["name"]): p for p in json.loads(out.read_text())["points"]}
    for batch in (1, 4):
        assert points[batch, "per-layer cache 66"]["hit_picks"] == 0
        assert points[batch, "prefetch 16 66 @ 0.0"]["hit_picks"] == 0
        hits = [points[batch, f"prefetch 16 66 @ {a:.1f}"]["hit_picks"] for a in bench.ACCURACIES]
        assert hits == sorted(hits) and hits[-1] > 0
        # At accuracy 1 with room for every miss, layers after the first gather nothing after their router.
        assert all(sum(step[1:]) == 0 for step in points[batch, "prefetch 16 66 @ 1.0"]["staged"])
        assert points[batch, "all on the GPU"]["step_s"] == []  # the CPU mode times nothing


def test_a_narrowed_prefetch_gather_is_launched_and_changes_nothing_but_its_width(tmp_path: Path,
                                                                                  monkeypatch) -> None:
    """Issue 40's sweep: --prefetch-programs N launches each layer's prefetch gather with N programs (the layer's
    own miss gather keeps the default) and every narrowed variant still equals the all-on-device chain with the
    same hits as the default gather."""
    eo = bench.kernel_sources.load_expert_offload(interpret=True)
    kernels = eo.expert_offload._kernels()
    widths: list[int | None] = []
    gather = kernels.gather_misses

    def recording(*args, programs=None, **kwargs):  # noqa: ANN001, ANN002, ANN003, ANN202
        widths.append(programs)
        return gather(*args, programs=programs, **kwargs)

    monkeypatch.setattr(kernels, "gather_misses", recording)
    out = tmp_path / "chain.json"
    assert bench.main(["--cpu", "--sizes", "66", "--batches", "1", "--steps", "2", "--prefetch-programs", "8",
                       "--out", str(out)]) == 0
    points = {p["name"]: p for p in json.loads(out.read_text())["points"]}
    for accuracy in bench.CAPPED_ACCURACIES:
        name = f"prefetch 16 66 @ {accuracy:.1f}"
        assert points[f"{name} p8"]["hit_picks"] == points[name]["hit_picks"]
    assert 8 in widths and None in widths  # the prefetch gathers narrowed, the miss gathers at the default
