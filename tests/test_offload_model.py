"""The expert-offload cost model (rigstack/offload_model.py), and how it does on seed 000's figures."""

from __future__ import annotations

import pytest

from rigstack import offload_model as om
from rigstack.errors import UserError

GIB = 2**30
# Seed 000: GLM-5.3-Flash NVFP4, 163.3 GiB of experts over 45 layers x 288, top-8; the wide gather 52.1 GB/s.
EXPERTS_GIB = 163.3
SEED = om.OffloadRig(layers=45, experts_per_layer=288, top_k=8, expert_bytes=EXPERTS_GIB * GIB / (45 * 288),
                     link_gb_s=52.1)


def test_step_is_compute_plus_the_misses_over_the_link():
    rig = om.OffloadRig(layers=2, experts_per_layer=10, top_k=4, expert_bytes=1e6, link_gb_s=1.0, compute_s=0.002)
    # 2 layers x 4 picks x (1 - 0.25) = 6 misses x 1 MB at 1 GB/s = 6 ms, plus 2 ms of compute.
    assert om.misses_per_step(rig, 0.25) == 6.0
    assert om.decode_tok_s(rig, 0.25) == pytest.approx(1 / 0.008)
    assert om.decode_tok_s(rig, 1.0) == pytest.approx(500.0)


def test_inverses_give_back_the_inputs():
    rig = om.OffloadRig(45, 288, 8, 13.5e6, 50.0, compute_s=0.015)
    tok_s = om.decode_tok_s(rig, 0.6)
    assert om.implied_hit_rate(rig, tok_s) == pytest.approx(0.6)
    assert om.implied_link_gb_s(rig, 0.6, tok_s) == pytest.approx(50.0)
    bare = om.OffloadRig(45, 288, 8, 13.5e6, 50.0)
    assert om.fit_compute_s(bare, 0.6, tok_s) == pytest.approx(0.015)


def test_zipf_fit_and_cache_budget():
    s = om.zipf_exponent(288, 0.35, 0.74)
    assert om.zipf_hit_rate(288, round(0.35 * 288), s) == pytest.approx(0.74, abs=1e-9)
    assert om.zipf_hit_rate(288, 288, s) == pytest.approx(1.0)
    assert om.cache_experts_for_budget(SEED, 66 * 45 * SEED.expert_bytes + 1) == 66
    assert om.cache_experts_for_budget(SEED, 1e15) == 288


@pytest.mark.parametrize("make, message", [
    (lambda: om.OffloadRig(45, 288, 8, 13.5e6, 0.0), "link_gb_s must be positive"),
    (lambda: om.OffloadRig(45, 4, 8, 13.5e6, 50.0), "top_k 8 exceeds the 4 experts"),
    (lambda: om.decode_tok_s(SEED, 1.2), "hit rate 1.2 is outside"),
    (lambda: om.resident_hit_rate(SEED, 200 * GIB), "bytes offloaded, but the experts hold"),
    (lambda: om.cache_experts_for_budget(SEED, GIB / 2), "holds no expert per layer"),
    (lambda: om.zipf_exponent(288, 0.35, 0.2), "not a concentration a Zipf law can fit"),
    (lambda: om.fit_compute_s(SEED, 0.0, 1000.0), "faster than the link allows"),
])
def test_bad_inputs_are_user_errors(make, message):
    with pytest.raises(UserError, match=message):
        make()


def seed_fit() -> om.OffloadRig:
    """Compute per step fitted to one seed figure: 11.34 tok/s, 125 GiB offloaded, no cache (graphs, wide gather)."""
    hit = om.resident_hit_rate(SEED, 125 * GIB)
    return om.OffloadRig(45, 288, 8, SEED.expert_bytes, 52.1, compute_s=om.fit_compute_s(SEED, hit, 11.34))


def test_seed_figures_without_cache():
    rig = seed_fit()
    assert rig.compute_s == pytest.approx(0.0166, abs=5e-4)
    # 105 GiB offloaded, graphs and the wide gather: the seed measured 13.53; the model is within 4%.
    assert om.decode_tok_s(rig, om.resident_hit_rate(rig, 105 * GIB)) == pytest.approx(13.03, abs=0.01)
    # 10.77 was that setup eager (graphs added 13%: 13.53 / 1.13 eager) with the default gather: the model
    # reproduces it only with a default gather of ~45 GB/s, not the half rate the seed wrote of.
    hit = om.resident_hit_rate(rig, 105 * GIB)
    eager = om.OffloadRig(45, 288, 8, SEED.expert_bytes, 52.1,
                          compute_s=om.fit_compute_s(SEED, hit, 13.53 / 1.13))
    assert om.implied_link_gb_s(eager, hit, 10.77) == pytest.approx(45.1, abs=0.2)


def test_seed_figures_with_the_per_layer_cache():
    """With Zipf hit rates fitted to "the hottest 35% take 74%", the model overshoots the cache runs by 23-25%."""
    rig = seed_fit()
    s = om.zipf_exponent(288, 0.35, 0.74)
    predicted = {hot: om.decode_tok_s(rig, om.zipf_hit_rate(288, hot, s)) for hot in (66, 54)}
    assert predicted[66] == pytest.approx(20.22, abs=0.01) and predicted[66] / 16.50 == pytest.approx(1.225, abs=0.01)
    assert predicted[54] == pytest.approx(18.78, abs=0.01) and predicted[54] / 14.99 == pytest.approx(1.253, abs=0.01)
    # The hit rates the measured figures imply: a flatter head than the Zipf fit (0.65 and 0.61).
    assert om.implied_hit_rate(rig, 16.50) == pytest.approx(0.529, abs=0.002)
    assert om.implied_hit_rate(rig, 14.99) == pytest.approx(0.464, abs=0.002)
    # What the model gets right: the cache beats the same offload without it, and more hot experts are faster.
    assert predicted[66] > predicted[54] > 11.34
