"""The correctness parts of the offloaded MoE layer benchmark (rigstack/bench/moe_layer.py), on CPU.

The synthetic trace has the seed's shape (per layer the hottest 35% take 74%, summed over layers much flatter);
hot sets, hit rates and the adaptive caches agree with hand-worked cases; and the offloaded layer step (patch
0013's remap and gather, then the torch MoE on [cache | staging]) gives the all-on-device layer's outputs bit for
bit, over consecutive steps on one staging buffer and when the staging buffer overflows.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from rigstack.bench import moe_layer as bench
from rigstack.bench import kernel_sources

MODULE = "vllm/model_executor/layers/fused_moe/expert_offload_kernels.py"
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def ko():
    return kernel_sources.load_module(MODULE, interpret=True)


def test_the_trace_is_concentrated_per_layer_and_flat_summed():
    exponent = bench.fit_exponent()
    trace, perms = bench.routing_trace(1000, exponent, seed=3)
    assert trace.shape == (45, 1000, 8)
    assert all(len(set(picks)) == 8 for picks in trace[:, :50].reshape(-1, 8).tolist())  # distinct picks a token
    assert not torch.equal(perms[0], perms[1])
    counts = bench.pick_counts(trace)
    assert counts.sum() == 45 * 1000 * 8
    assert float(bench.top_share(counts).mean()) == pytest.approx(0.74, abs=0.02)
    assert float(bench.top_share(counts.sum(0, keepdim=True))[0]) < 0.5
    held_out, _ = bench.routing_trace(500, exponent, seed=4, perms=perms)
    per_layer = bench.hit_rate(held_out, bench.per_layer_hot(counts, 66))
    summed = bench.hit_rate(held_out, bench.summed_hot(counts, 66))
    oracle = bench.hit_rate(held_out, bench.per_layer_hot(bench.pick_counts(held_out), 66))
    assert summed + 0.2 < per_layer <= oracle


def test_hot_sets_and_hit_rates_by_hand():
    # 2 layers, 4 tokens, 2 picks: layer 0 favours 1, layer 1 favours 2; summed, 2 leads.
    trace = torch.tensor([[[1, 0], [1, 3], [1, 2], [0, 3]], [[2, 0], [2, 3], [2, 1], [2, 0]]])
    counts = bench.pick_counts(trace, n_experts=4)
    assert counts.tolist() == [[2, 3, 1, 2], [2, 1, 4, 1]]
    assert bench.per_layer_hot(counts, 1).tolist() == [[1], [2]]
    assert bench.summed_hot(counts, 1).tolist() == [[2], [2]]
    assert bench.hit_rate(trace, bench.per_layer_hot(counts, 1), n_experts=4) == pytest.approx(7 / 16)
    assert bench.hit_rate(trace, bench.summed_hot(counts, 1), n_experts=4) == pytest.approx(5 / 16)
    # the oracle (a layer's own top-k) is the best static set of its size
    for other in ([[0], [0]], [[3], [1]], [[0], [2]]):
        assert bench.hit_rate(trace, torch.tensor(other), n_experts=4) < 7 / 16


def test_adaptive_caches_by_hand():
    trace = torch.tensor([[[0, 1], [0, 2], [3, 4], [0, 1]]])
    # LRU: 0 hits once (step 2); step 3 evicts it. LFU keeps 0 (picked twice) and hits it at step 4 too.
    assert bench.adaptive_hit_rate(trace, 2, "lru") == pytest.approx(1 / 8)
    assert bench.adaptive_hit_rate(trace, 2, "lfu") == pytest.approx(2 / 8)
    assert bench.adaptive_hit_rate(trace, 5, "lru") == pytest.approx(3 / 8)  # never evicts: every repeat hits
    with pytest.raises(ValueError, match="lru or lfu"):
        bench.adaptive_hit_rate(trace, 2, "fifo")


SMALL = {"hidden": 32, "inter": 8}  # 768-byte experts


def _layer_case(ko, hot: list[int], staging: int):
    host = bench.host_experts(16, 3 * SMALL["inter"] * SMALL["hidden"], seed=5, pin=False)
    layer = bench.offloaded_layer(ko, host, hot, staging, torch.device("cpu"))
    gen = torch.Generator().manual_seed(6)
    return host, layer, gen


def test_the_offloaded_step_is_the_all_on_device_layer_bit_for_bit(ko):
    hot = [3, 5, 7, 1, 12]
    host, layer, gen = _layer_case(ko, hot, staging=8)
    assert not torch.isnan(host.view(torch.float8_e4m3fn).float()).any()
    for _ in range(4):  # consecutive steps on one staging buffer: nothing of a step before leaks
        ids = torch.randperm(16, generator=gen)[:8].to(torch.int32)
        x = torch.randn(SMALL["hidden"], generator=gen).to(torch.bfloat16)
        gates = torch.softmax(torch.randn(8, generator=gen), 0)
        got = bench.offloaded_step(ko, layer, x, ids, gates, **SMALL)
        assert torch.equal(got, bench.moe(x, host, ids, gates, **SMALL))
        count = ko.remap_reference(ids.view(1, -1), layer.slot_of_expert, layer.n_cache, layer.staging)[2]
        assert bench.misses(ids.view(1, -1), hot) == int(count) == len(set(ids.tolist()) - set(hot))


def test_picks_past_the_staging_size_contribute_nothing(ko):
    host, layer, gen = _layer_case(ko, hot=[0], staging=2)
    ids = torch.tensor([0, 9, 4, 6, 2, 11, 13, 15], dtype=torch.int32)  # 7 misses for 2 staging slots
    x = torch.randn(SMALL["hidden"], generator=gen).to(torch.bfloat16)
    gates = torch.softmax(torch.randn(8, generator=gen), 0)
    got = bench.offloaded_step(ko, layer, x, ids, gates, **SMALL)
    staged = torch.tensor([e in (0, 2, 4) for e in ids.tolist()])  # the hit and the 2 lowest misses
    assert torch.equal(got, bench.moe(x, host, torch.where(staged, ids, -1), gates, **SMALL))
    assert not torch.equal(got, bench.moe(x, host, ids, gates, **SMALL))


def _command(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "scripts/bench_moe_layer.py", *args], cwd=ROOT, check=False,
                          capture_output=True, text=True, timeout=300, env={**os.environ, "CUDA_VISIBLE_DEVICES": ""})


def test_the_command_reports_the_trace_and_says_why_it_timed_nothing():
    done = _command("--sizes", "0,66", "--collect", "300", "--held-out", "200", "--no-adaptive", "--tokens", "8")
    assert done.returncode == 0, done.stderr
    assert "hit rate at  66 hot a layer: per-layer cache" in done.stdout
    assert "layer step: not timed (no CUDA GPU here)" in done.stdout
    assert "ms/step" not in done.stdout


def test_the_command_refuses_bad_sizes_in_one_line():
    done = _command("--sizes", "66,300")
    assert done.returncode == 1
    assert done.stderr.strip().splitlines() == [
        "error: --sizes '66,300': each cache size must be between 0 and 287 experts a layer"]
