"""Patch 0019: expert offload prefetch (VLLM_EXPERT_OFFLOAD_PREFETCH=N). On CPU with vLLM's own CPU MoE kernel over
prepacked weights (test_0014's layer): a chain of offloaded layers, each filling the next one's prefetch area with
that layer's predicted experts, against the same layers with every expert resident; the hit counters against a
hand model of the prediction; and the settings that must stop the boot."""

from __future__ import annotations

import pytest
import torch
from testing.moe_offload import HOT, K, kernel, offload_settings, prepacked, resident_output, route

CACHE, STAGING, PREFETCH = 3, 2, 2
CACHED = set(HOT[:CACHE])
# Each layer's picks a decode step: repeats from one step to the next (what the prediction relies on), a step whose
# misses all differ from the step before, a step with every pick cached.
STEPS = [[0, 5], [0, 3], [4, 6], [4, 6], [1, 7], [2, 4], [2, 3], [0, 6]]


@pytest.fixture(scope="module")
def eo():
    from vllm.model_executor.layers.fused_moe import expert_offload

    return expert_offload


def _chain(eo, weights, n_layers: int, prefetch: int):
    layers, params = [], []
    for i in range(n_layers):
        p = {name: torch.nn.Parameter(t.clone(), requires_grad=False) for name, t in zip(("w13", "w2"), weights)}
        layers.append(eo.LayerOffload(p, HOT, CACHE, STAGING, torch.device("cpu"), 8, False, f"layers.{i}", prefetch))
        params.append(p)
    if prefetch:
        eo.expert_prefetch.link(layers, torch.device("cpu"))
    return layers, params


def _expected_hits(steps: list[list[int]]) -> tuple[int, int]:
    """(prefetch hits, staged picks) of a layer that a layer before it fills: the prediction is the previous
    step's uncached picks, the first PREFETCH of them in ascending id order."""
    hits = staged = 0
    predicted: list[int] = []
    for picks in steps:
        for e in picks:
            if e not in CACHED:
                hits, staged = (hits + 1, staged) if e in predicted else (hits, staged + 1)
        predicted = sorted(set(picks) - CACHED)[:PREFETCH]
    return hits, staged


def test_prefetched_chain_equals_the_resident_layers_and_counts_its_hits(eo) -> None:
    weights = prepacked(torch.bfloat16)
    layers, params = _chain(eo, weights, 3, PREFETCH)
    assert params[0]["w13"].shape[0] == CACHE + PREFETCH + STAGING  # [cache | prefetch | staging]
    for step, picks in enumerate(STEPS):
        for i, (layer, p) in enumerate(zip(layers, params)):
            x, w, _ = route(1, 10 * step + i)
            ids = torch.tensor([picks], dtype=torch.int32)
            calls: list[torch.Tensor] = []
            out = layer.forward(x, ids, w, kernel(p["w13"], p["w2"], calls))
            assert len(calls) == 1 and layer.path(1, K) == "staged"
            assert torch.equal(out, resident_output(weights, x, w, ids)), (step, i)
    # The first layer has no layer before it to fill its area; the others hit exactly what the prediction says.
    hits, staged = _expected_hits(STEPS)
    assert hits > 0 and staged > 0
    assert eo.expert_prefetch.counters(layers) == {
        "layers.0": {"hits": 0, "staged": hits + staged}, "layers.1": {"hits": hits, "staged": staged},
        "layers.2": {"hits": hits, "staged": staged}}
    # Layer 1's area holds what layer 0 gathered for the last step: the first PREFETCH uncached picks of the one before.
    for slot, expert in enumerate(sorted(set(STEPS[-2]) - CACHED)[:PREFETCH]):
        assert torch.equal(layers[1].buf["w13"][CACHE + slot], weights[0][expert])


def test_prefill_with_prefetch_on_is_the_prefill_without(eo) -> None:
    """Grouped prefill neither prefetches nor reads the area; its staging slots moved behind it."""
    weights = prepacked(torch.bfloat16)
    x, w, ids = route(8, 8)
    outs = []
    for prefetch in (0, PREFETCH):
        layers, params = _chain(eo, weights, 2, prefetch)
        assert layers[1].path(*ids.shape) == "grouped"
        outs.append(layers[1].forward(x, ids, w, kernel(params[1]["w13"], params[1]["w2"])))
    assert torch.equal(outs[0], outs[1])


def test_prefetch_without_offload_stops_the_boot(eo, monkeypatch) -> None:
    monkeypatch.delenv("VLLM_EXPERT_OFFLOAD", raising=False)
    monkeypatch.setenv("VLLM_EXPERT_OFFLOAD_PREFETCH", "4")
    with pytest.raises(eo.ExpertOffloadError, match="^VLLM_EXPERT_OFFLOAD_PREFETCH=4: prefetch fills offloaded "
                                                    "layers' prefetch areas, but VLLM_EXPERT_OFFLOAD is unset"):
        eo.settings_from_env()
    monkeypatch.setenv("VLLM_EXPERT_OFFLOAD_PREFETCH", "0")
    assert eo.settings_from_env() is None


def test_a_negative_prefetch_is_refused(eo, monkeypatch) -> None:
    with pytest.raises(eo.ExpertOffloadError, match="^VLLM_EXPERT_OFFLOAD_PREFETCH=-1: give the prefetch slots"):
        offload_settings(eo, monkeypatch, VLLM_EXPERT_OFFLOAD_CACHE="3", VLLM_EXPERT_OFFLOAD_PREFETCH="-1")


def test_a_prefetch_area_past_the_offloaded_experts_is_refused(eo) -> None:
    with pytest.raises(eo.ExpertOffloadError, match="^VLLM_EXPERT_OFFLOAD_PREFETCH=6: more prefetch slots than "
                                                    "layer layers.0's 5 offloaded experts"):
        _chain(eo, prepacked(torch.bfloat16), 1, 6)


def test_the_prefetch_areas_come_out_of_the_budget(eo, monkeypatch) -> None:
    mib = 1 << 20
    settings = offload_settings(eo, monkeypatch, VLLM_EXPERT_OFFLOAD_BUDGET_GIB=str(16 / 1024),
                         VLLM_EXPERT_OFFLOAD_PREFETCH="2")
    assert settings.prefetch == 2
    assert eo.cache_size(settings, n_experts=8, n_layers=4, expert_bytes=mib) == 2  # (16 - 4 x 2) MiB / 4 layers
    over = offload_settings(eo, monkeypatch, VLLM_EXPERT_OFFLOAD_BUDGET_GIB=str(8 / 1024),
                            VLLM_EXPERT_OFFLOAD_PREFETCH="2")
    with pytest.raises(eo.ExpertOffloadError, match=r"^VLLM_EXPERT_OFFLOAD_PREFETCH=2: the prefetch areas \(4 "
                                                    r"layers x 2 x 1.0 MiB = 0.01 GiB\) take all of "
                                                    r"VLLM_EXPERT_OFFLOAD_BUDGET_GIB=0.0078125"):
        eo.cache_size(over, n_experts=8, n_layers=4, expert_bytes=mib)
