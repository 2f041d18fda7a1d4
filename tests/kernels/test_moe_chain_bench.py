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


def test_the_gather_width_and_the_switch_reach_the_layers_and_change_nothing_else(tmp_path: Path,
                                                                                  monkeypatch) -> None:
    """Issue 40: the patch's defaults launch each prefetch gather with 8 programs, --prefetch-programs N with N and
    the "full gather" group at the kernel's full count (the miss gathers always at the full count); without the
    switch every width gives the same hits; with it, a layer whose guesses all miss is left unfilled after its first
    judged step, on the device as in the host replica (the bench stops when they differ)."""
    eo = bench.kernel_sources.load_expert_offload(interpret=True)
    kernels = eo.expert_offload._kernels()
    widths: list[int | None] = []
    gather = kernels.gather_misses

    def recording(*args, programs=None, **kwargs):  # noqa: ANN001, ANN002, ANN003, ANN202
        widths.append(programs)
        return gather(*args, programs=programs, **kwargs)

    monkeypatch.setattr(kernels, "gather_misses", recording)
    out = tmp_path / "chain.json"
    assert bench.main(["--cpu", "--sizes", "66", "--batches", "1", "--steps", "3", "--prefetch-programs", "5",
                       "--out", str(out)]) == 0
    points = {p["name"]: p for p in json.loads(out.read_text())["points"]}
    for accuracy in bench.CAPPED_ACCURACIES:
        name = f"prefetch 16 66 @ {accuracy:.1f}"
        assert points[f"{name} p5"]["hit_picks"] == points[f"{name} full gather"]["hit_picks"] == (
            points[f"{name} no switch"]["hit_picks"])
    assert {8, 5, None} <= set(widths)
    # Accuracy 0: the switch leaves every layer after the first unfilled once it has judged one guess.
    off, on = points["prefetch 16 66 @ 0.0"], points["prefetch 16 66 @ 0.0 no switch"]
    assert off["off_steps"] > 0 and on["off_steps"] == 0
    assert sum(off["prefetched"][0]) == sum(on["prefetched"][0]) > 0 and sum(off["prefetched"][2]) == 0
    assert points["prefetch 16 66 @ 1.0"]["off_steps"] == 0


def test_the_capped_slot_count_is_the_overlap_models_best() -> None:
    """The capped sweep's slot count is the one rigstack/offload_model.py's overlap model gives the shortest step
    (the bench writes the model out, as it imports no library); with one H100's batch-1 figures (layer compute
    0.59 ms, an expert 0.39 ms over the link) it lies between one slot and all of them."""
    import statistics

    import torch

    from rigstack import offload_model

    eo = bench.kernel_sources.load_expert_offload(interpret=True)
    shape, seed = bench.Shape(hidden=8, inter=8), 0
    trace = bench.mlb.traces(4000, 8 + 1, seed)
    hot = [h.tolist() for h in bench.mlb.per_layer_hot(bench.mlb.pick_counts(trace.collect), 66)[:shape.layers]]
    chain = bench.Chain(trace.held_out, 8, 1, shape, torch.device("cpu"), seed)
    compute_s, per_expert_s = 0.59e-3, 0.39e-3

    def library_s(slots: int) -> float:
        lists, _ = bench.predictions(chain.ids, hot, slots, bench.GOAL_ACCURACY, bench.mlb.N_EXPERTS, seed)
        staged, fetched, _, _ = bench.traffic(chain.ids, hot, lists, eo.expert_prefetch.BREAK_EVEN,
                                              eo.expert_prefetch.DECAY)
        return statistics.mean(offload_model.overlapped_layers_s(compute_s, per_expert_s, m, f)
                               for m, f in zip(staged, fetched))
    best = bench.best_slots(chain, hot, shape, compute_s, per_expert_s, eo.expert_prefetch, seed)
    assert best == min(range(1, shape.prefetch + 1), key=library_s)
    assert 1 < best < shape.prefetch
