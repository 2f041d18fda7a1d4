"""rigstack.expert_trace: per-layer concentration, hot sets from a trace, the cache size from a budget, the file."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rigstack import expert_trace as et
from rigstack.errors import UserError

MODEL = {"architecture": "Qwen3MoeForCausalLM", "moe_layers": 2, "experts": 8, "hidden_size": 256}
# Two layers whose hot experts differ: summed over layers the counts look flat (seed 000's trap).
COUNTS = {"layers.0": (40, 30, 10, 5, 5, 4, 3, 3), "layers.1": (3, 3, 4, 5, 5, 10, 30, 40)}


def _trace(counts: dict[str, tuple[int, ...]] = COUNTS) -> et.Trace:
    return et.parse_counts({"format": et.FORMAT, "model": MODEL, "expert_bytes": 1 << 20,
                            "counts": {k: list(v) for k, v in counts.items()}}, "test")


def test_each_layer_gets_its_own_hot_set_and_beats_the_summed_one() -> None:
    plan = et.plan(_trace(), cache=2)
    assert plan.hot == {"layers.0": [0, 1], "layers.1": [7, 6]}
    assert plan.hit_rate == pytest.approx(0.70)
    assert plan.summed_hit_rate < 0.5  # the summed counts pick 0 and 7 (ties by id): one hot expert a layer
    assert plan.layers[0].top_share == pytest.approx(70 / 100 + 10 / 100)  # hottest 35% of 8 = 3 experts


def test_budget_sizes_the_cache_with_the_cost_model() -> None:
    assert et.cache_for(_trace(), None, 6 / 1024) == 3  # 6 MiB over 2 layers of 1 MiB experts
    with pytest.raises(UserError, match="holds no expert per layer"):
        et.cache_for(_trace(), None, 1 / 1024)
    with pytest.raises(UserError, match="choose 1 to 7"):
        et.cache_for(_trace(), 8, None)
    with pytest.raises(UserError, match="exactly one of --cache"):
        et.cache_for(_trace(), 2, 1.0)


def test_no_picks_yet_is_a_clear_error() -> None:
    with pytest.raises(UserError, match="no expert picks yet"):
        et.plan(_trace({"layers.0": (0,) * 8, "layers.1": (0,) * 8}), cache=2)


def test_an_answer_that_is_not_a_count_table_is_refused() -> None:
    with pytest.raises(UserError, match="not a rigstack-hot-experts/1 count table"):
        et.parse_counts({"results": []}, "http://x/collective_rpc")


def test_the_hot_set_file_is_what_the_patch_reads(tmp_path: Path) -> None:
    out = tmp_path / "sub" / "hot.json"
    et.write_hot_sets(out, _trace(), et.plan(_trace(), cache=2))
    data = json.loads(out.read_text())
    assert data == {"format": "rigstack-hot-experts/1", "model": MODEL, "cache": 2,
                    "layers": {"layers.0": [0, 1], "layers.1": [7, 6]}}
    assert [p.name for p in out.parent.iterdir()] == ["hot.json"]  # no temporary file left


def test_the_offload_profile_serves_with_the_hot_set_cache_not_cpu_offload() -> None:
    from rigstack.profiles import load_profile
    from rigstack.render import serve_command

    command = serve_command(load_profile("rtxpro6000-1x-offload"), model=Path("/m"))
    assert command.env["VLLM_EXPERT_OFFLOAD"] == "/data/models/GLM-5.3-Flash-NVFP4.hot-experts.json"
    assert command.env["VLLM_EXPERT_OFFLOAD_CACHE"] == "54"
    assert command.env["VLLM_EXPERT_OFFLOAD_GROUPED_MIN_TOKENS"] == "48"
    assert not any("cpu-offload" in arg for arg in command.argv)
