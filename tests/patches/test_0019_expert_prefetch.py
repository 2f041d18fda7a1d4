"""Patch 0019: expert offload prefetch (VLLM_EXPERT_OFFLOAD_PREFETCH=N). On CPU with vLLM's own CPU MoE kernel over
prepacked weights (test_0014's layer): a chain of offloaded layers, each filling the next one's prefetch area with
that layer's predicted experts, against the same layers with every expert resident; the hit counters against a
hand model of the prediction and of the switch that stops filling a layer whose guesses miss; the program count the
prefetch gather launches with; and the settings that must stop the boot."""

from __future__ import annotations

import re
from collections import Counter

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


def _chain(eo, weights, n_layers: int, prefetch: int, break_even: float = 0.0, programs: int = 8):
    """Offloaded layers, each filling the next one's area; break-even 0 (the default here): every guess gathered."""
    layers, params = [], []
    for i in range(n_layers):
        p = {name: torch.nn.Parameter(t.clone(), requires_grad=False) for name, t in zip(("w13", "w2"), weights)}
        layers.append(eo.LayerOffload(p, HOT, CACHE, STAGING, torch.device("cpu"), 8, False, f"layers.{i}", prefetch,
                                      programs, break_even))
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
        "layers.0": {"hits": 0, "staged": hits + staged, "off_steps": 0},
        "layers.1": {"hits": hits, "staged": staged, "off_steps": 0},
        "layers.2": {"hits": hits, "staged": staged, "off_steps": 0}}
    # Layer 1's area holds what layer 0 gathered for the last step: the first PREFETCH uncached picks of the one before.
    for slot, expert in enumerate(sorted(set(STEPS[-2]) - CACHED)[:PREFETCH]):
        assert torch.equal(layers[1].buf["w13"][CACHE + slot], weights[0][expert])


# Guesses that hit, then miss (the switch turns the fill off), then would hit again (it turns back on).
SWITCH_STEPS = [[0, 3], [0, 3], [4, 6], [2, 3], [2, 3], [2, 3], [1, 7], [0, 6], [0, 6]]


def _switch_model(steps: list[list[int]], break_even: float, decay: float) -> tuple[int, int, int, list[bool]]:
    """(hits, staged picks, steps with the area left empty, whether each step's area was filled) of a layer that a
    layer before it fills while the decayed share of its guesses that were then picked is at least the break-even."""
    hits = staged = off = 0
    used = guessed = 0.0
    on, guess, filled = True, [], []
    for picks in steps:
        filled.append(on)
        off += not on
        area = guess if on else []
        for e in picks:
            if e not in CACHED:
                hits, staged = (hits + 1, staged) if e in area else (hits, staged + 1)
        used = decay * used + len(set(guess) & set(picks))
        guessed = decay * guessed + len(guess)
        on = used >= break_even * guessed
        guess = sorted(set(picks) - CACHED)[:PREFETCH]
    return hits, staged, off, filled


def test_a_layer_whose_guesses_miss_is_not_filled_until_they_would_pay(eo) -> None:
    """The switch (VLLM_EXPERT_OFFLOAD_PREFETCH_BREAK_EVEN): judged on the device from the layer's own guesses,
    gathered or not; while off, the layer before gathers nothing into its area, and the output never changes."""
    weights = prepacked(torch.bfloat16)
    break_even = 0.5
    layers, params = _chain(eo, weights, 2, PREFETCH, break_even)
    hits, staged, off, filled = _switch_model(SWITCH_STEPS, break_even, eo.expert_prefetch.DECAY)
    assert False in filled and filled[filled.index(False):].count(True) and hits > 0  # off, then on again
    for run in range(2):  # the second run after restart(): the switch starts over as on the first step
        empty_seen = False
        for step, picks in enumerate(SWITCH_STEPS):
            for i, (layer, p) in enumerate(zip(layers, params)):
                x, w, _ = route(1, 10 * step + i)
                ids = torch.tensor([picks], dtype=torch.int32)
                out = layer.forward(x, ids, w, kernel(p["w13"], p["w2"]))
                assert torch.equal(out, resident_output(weights, x, w, ids)), (run, step, i)
            nxt = layers[1].prefetch
            if not bool(nxt.on) and int(nxt.guess_count) > 0:
                assert int(nxt.predicted_count) == 0 and bool((nxt.predicted < 0).all())  # guessed, not gathered
                empty_seen = True
        assert empty_seen
        counted = eo.expert_prefetch.counters(layers)["layers.1"]
        assert counted == {"hits": hits, "staged": staged, "off_steps": off}, run
        for layer in layers:
            layer.prefetch.restart()


def test_the_prefetch_gather_launches_with_its_own_program_count(eo, monkeypatch) -> None:
    """The prefetch gather runs with VLLM_EXPERT_OFFLOAD_PREFETCH_PROGRAMS programs; the layer's own miss gather
    keeps the kernel's full count (None)."""
    kernels = eo._kernels()
    calls: list[tuple[int, int | None]] = []
    full = kernels.gather_misses

    def spy(src, miss_list, miss_count, dst, **kwargs):  # noqa: ANN001, ANN202
        calls.append((dst.shape[0], kwargs.get("programs")))
        return full(src, miss_list, miss_count, dst, **kwargs)

    monkeypatch.setattr(kernels, "gather_misses", spy)
    weights = prepacked(torch.bfloat16)
    for programs in (8, 3):
        calls.clear()
        layers, params = _chain(eo, weights, 2, PREFETCH, programs=programs)
        for step, picks in enumerate(STEPS[:3]):
            for i, (layer, p) in enumerate(zip(layers, params)):
                x, w, _ = route(1, 10 * step + i)
                layer.forward(x, torch.tensor([picks], dtype=torch.int32), w, kernel(p["w13"], p["w2"]))
        # Per step and weight (w13, w2): layer 0's misses and layer 1's at the full count (None), layer 0's fill of
        # layer 1's area at the set count.
        assert Counter(width for _, width in calls) == {None: 3 * 2 * 2, programs: 3 * 2}


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


PROGRAMS, BREAK_EVEN = "VLLM_EXPERT_OFFLOAD_PREFETCH_PROGRAMS", "VLLM_EXPERT_OFFLOAD_PREFETCH_BREAK_EVEN"


@pytest.mark.parametrize(("name", "raw", "message"), [
    (PROGRAMS, "0", f"{PROGRAMS}=0: the prefetch gather needs at least 1 Triton program (unset: 8)"),
    (PROGRAMS, "-4", f"{PROGRAMS}=-4: the prefetch gather needs at least 1 Triton program"),
    (PROGRAMS, "many", f"{PROGRAMS}='many' is not a whole number"),
    (BREAK_EVEN, "1", f"{BREAK_EVEN}='1': give a share of guessed experts from 0 (every guess gathered) up to but "
                      "not 1 (unset: 0.3)"),
    (BREAK_EVEN, "-0.1", f"{BREAK_EVEN}='-0.1': give a share"),
    (BREAK_EVEN, "nan", f"{BREAK_EVEN}='nan': give a share"),
    (BREAK_EVEN, "half", f"{BREAK_EVEN}='half': give a share"),
])
def test_a_program_count_or_break_even_the_layer_cannot_use_stops_the_boot(eo, monkeypatch, name: str, raw: str,
                                                                           message: str) -> None:
    with pytest.raises(eo.ExpertOffloadError, match="^" + re.escape(message)):
        offload_settings(eo, monkeypatch, VLLM_EXPERT_OFFLOAD_CACHE="3", VLLM_EXPERT_OFFLOAD_PREFETCH="2",
                         **{name: raw})


def test_the_gather_and_switch_settings_default_to_the_measured_ones(eo, monkeypatch) -> None:
    settings = offload_settings(eo, monkeypatch, VLLM_EXPERT_OFFLOAD_CACHE="3", VLLM_EXPERT_OFFLOAD_PREFETCH="2")
    assert (settings.prefetch_programs, settings.break_even) == (8, 0.3)
    settings = offload_settings(eo, monkeypatch, VLLM_EXPERT_OFFLOAD_CACHE="3", VLLM_EXPERT_OFFLOAD_PREFETCH="2",
                                VLLM_EXPERT_OFFLOAD_PREFETCH_PROGRAMS="16",
                                VLLM_EXPERT_OFFLOAD_PREFETCH_BREAK_EVEN="0")
    assert (settings.prefetch_programs, settings.break_even) == (16, 0.0)


def _staging_rows(layer, name: str) -> torch.Tensor:
    return layer.buf[name][layer.staging_start:]


def test_every_layer_stages_into_one_region(eo) -> None:
    """Issue 40 item 3: one physical staging region behind every layer's [cache | prefetch | staging] tensor: a row
    written through one layer's staging is read through every other's, the cache and prefetch rows stay each
    layer's own, the device memory counts the region once, and the chain still equals the resident layers."""
    weights = prepacked(torch.bfloat16)
    layers, params = _chain(eo, weights, 3, PREFETCH)
    for name in ("w13", "w2"):
        probe = torch.full_like(_staging_rows(layers[0], name)[0], 3.0)
        _staging_rows(layers[0], name)[0].copy_(probe)
        assert all(torch.equal(_staging_rows(layer, name)[0], probe) for layer in layers[1:])
        layers[1].buf[name][0].fill_(5.0)  # a cached row: the other layers keep theirs
        assert not torch.equal(layers[0].buf[name][0], layers[1].buf[name][0])
    assert all(layer.shared_staging for layer in layers)
    own = sum(b[:CACHE + PREFETCH].numel() * b.element_size() for b in layers[0].buf.values())
    assert eo.device_bytes(layers) == 3 * own + layers[0].staging_bytes
    fresh, fresh_params = _chain(eo, weights, 3, PREFETCH)
    for picks in STEPS:
        x, w, ids = route(1, 7, dtype=torch.bfloat16)
        ids = torch.tensor([picks], dtype=torch.int32)
        for layer, p in zip(fresh, fresh_params):
            assert torch.equal(layer.forward(x, ids, w, kernel(p["w13"], p["w2"])), resident_output(weights, x, w, ids))


def test_the_switch_gives_each_layer_staging_of_its_own(eo, monkeypatch) -> None:
    settings = offload_settings(eo, monkeypatch, VLLM_EXPERT_OFFLOAD_CACHE="3",
                                VLLM_EXPERT_OFFLOAD_SHARED_STAGING="0")
    assert settings.shared_staging is False
    assert offload_settings(eo, monkeypatch, VLLM_EXPERT_OFFLOAD_CACHE="3",
                            VLLM_EXPERT_OFFLOAD_SHARED_STAGING="").shared_staging is True
    weights = prepacked(torch.bfloat16)
    layers = []
    for i in range(2):
        p = {name: torch.nn.Parameter(t.clone(), requires_grad=False) for name, t in zip(("w13", "w2"), weights)}
        layers.append(eo.LayerOffload(p, HOT, CACHE, STAGING, torch.device("cpu"), 8, False, f"layers.{i}",
                                      shared_staging=settings.shared_staging))
    _staging_rows(layers[0], "w13").fill_(3.0)
    _staging_rows(layers[1], "w13").fill_(4.0)
    assert not layers[0].shared_staging and bool((_staging_rows(layers[0], "w13") == 3.0).all())
    assert eo.device_bytes(layers) == sum(layer.device_bytes for layer in layers)


def test_a_shared_staging_value_other_than_0_or_1_stops_the_boot(eo, monkeypatch) -> None:
    with pytest.raises(eo.ExpertOffloadError, match=r"VLLM_EXPERT_OFFLOAD_SHARED_STAGING='yes': give 1 .* or 0"):
        offload_settings(eo, monkeypatch, VLLM_EXPERT_OFFLOAD_CACHE="3", VLLM_EXPERT_OFFLOAD_SHARED_STAGING="yes")


def test_shared_staging_with_micro_batching_stops_the_boot(eo, monkeypatch) -> None:
    """Two micro-batches (--enable-dbo) can run MoE layers at once; one region would mix their experts."""
    from vllm.config import VllmConfig, set_current_vllm_config

    offload_settings(eo, monkeypatch, VLLM_EXPERT_OFFLOAD_CACHE="3")
    model = torch.nn.Module()
    model.layer = torch.nn.Module()
    model.layer.expert_offload_wanted = True
    config = VllmConfig()
    # Set after validation: the CPU platform refuses micro-batching itself, a GPU one takes it.
    config.parallel_config.ubatch_size = 2
    assert config.parallel_config.use_ubatching
    with set_current_vllm_config(config):
        with pytest.raises(eo.ExpertOffloadError, match="SHARED_STAGING=1 .* micro-batching"):
            eo.setup_model(model, torch.device("cpu"))
