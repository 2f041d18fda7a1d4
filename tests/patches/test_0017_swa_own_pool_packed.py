"""Patch 0017: with VLLM_SWA_OWN_POOL=1 in a block-outer layout, sliding-window layers take a pool of their own
instead of being packed beside the target's pages, where their wider page sets every block's stride on their
stage and each of their ids costs a whole block on every stage (seed 002's patch 0024: "each costs a full MLA page
on every rank").

GLM-5.3-Flash is packed block-outer because its kpool tail backend takes BLHNC only. glm5next cannot be imported on
the CPU twin, and the CPU attention kernel reads a cache's blocks densely (its backend declares LBHNC only), so the
packed path cannot be served here: it is run in process through vLLM's real engine config, the real layers'
specs (testing.tinypair: the tiny MLA target and a 64-token-window DFlash drafter), the BLHNC layout that
GLM-5.3-Flash's backends resolve to, and vLLM's own get_kv_cache_configs over two pipeline stages of 3 and 1
target layers, the drafter on the last (as seed 002's 7,5,7,5,7,5,7,2 leaves the drafter beside 2 layers).
"""

from __future__ import annotations

import pytest

from testing import tinypair

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")

SWITCH = "VLLM_SWA_OWN_POOL"
GIB = 1 << 30
MLA_PAGE = 16 * 576 * 2  # 18,432 B
DRAFTER_PAGE = 32 * 4 * 64 * 2 * 2  # 32,768 B


@pytest.fixture(scope="module")
def stages(single_rank_dist: None) -> tuple[object, list[dict]]:
    config = tinypair.engine_config(64, 4)
    specs = tinypair.layer_specs(config)
    config.cache_config.kv_cache_layout = "BLHNC"  # as GLM-5.3-Flash's kpool tail backend resolves it
    names = list(specs)
    # Stage 0: target layers 0-2; stage 1: layer 3 and the drafter (built on the last rank).
    return config, [{name: specs[name] for name in names[:3]}, {name: specs[name] for name in names[3:]}]


def _plan(stages: tuple[object, list[dict]], monkeypatch: pytest.MonkeyPatch, switch: str | None) -> tuple:
    from vllm.v1.core.kv_cache_planning import get_global_kv_cache_groups, get_kv_cache_configs
    from vllm.v1.core.kv_cache_utils import generate_scheduler_kv_cache_config, get_kv_cache_capacity

    config, per_stage = stages
    if switch is None:
        monkeypatch.delenv(SWITCH, raising=False)
    else:
        monkeypatch.setenv(SWITCH, switch)
    # As the engine core plans: the whole model's groups, then each stage's config.
    groups = get_global_kv_cache_groups(config, [dict(stage) for stage in per_stage])
    configs = get_kv_cache_configs(config, [dict(stage) for stage in per_stage], [GIB, GIB], groups)
    return configs, get_kv_cache_capacity(config, generate_scheduler_kv_cache_config(configs))


def _stride(kv_config: object, layer: str) -> int:
    (tensor,) = [tensor for tensor in kv_config.kv_cache_tensors if layer in tensor.layers]
    return tensor.block_stride


@pytest.mark.upstream_guard
def test_without_the_switch_the_drafter_sets_the_last_stages_block_stride(stages, monkeypatch) -> None:
    config, per_stage = stages
    target_layer, drafter = list(per_stage[1])
    (first, last), (tokens, concurrency) = _plan(stages, monkeypatch, None)
    # The packed block holds one page per group: on the last stage the drafter's 32,768 B, not its 18,432 B one.
    assert _stride(last, target_layer) == _stride(last, drafter) == DRAFTER_PAGE
    assert _stride(first, next(iter(per_stage[0]))) == 3 * MLA_PAGE
    # A 2,048-token request: 128 target ids and 65 drafter ids, all from the shared pool.
    assert concurrency == first.num_blocks / (128 + 65)


def test_with_the_switch_the_drafter_takes_a_pool_of_its_own(stages, monkeypatch) -> None:
    from vllm.v1.kv_cache_interface import SlidingWindowSpec

    config, per_stage = stages
    target_layer, drafter = list(per_stage[1])
    (_, before) = _plan(stages, monkeypatch, None)
    (first, last), (tokens, concurrency) = _plan(stages, monkeypatch, "1")
    # The last stage's stride is its target page again; the drafter's blocks lie after the shared pool.
    assert _stride(last, target_layer) == MLA_PAGE and _stride(last, drafter) == DRAFTER_PAGE
    (group,) = [group for group in last.kv_cache_groups if drafter in group.layer_names]
    assert isinstance(group.kv_cache_spec, SlidingWindowSpec) and group.kv_cache_spec.sliding_window == 64
    own = getattr(group, "own_pool_blocks", None)
    assert own == 4 * 65 + 1  # max-num-seqs requests of 65 window blocks, and the null block
    (region,) = [tensor for tensor in last.kv_cache_tensors if drafter in tensor.layers]
    assert region.offset == last.num_blocks * MLA_PAGE and last.num_blocks_of(region) == own
    # Stage 0 binds as before (its three pages a block), and a request now takes only its 128 target ids.
    assert first.num_blocks == last.num_blocks == GIB // (3 * MLA_PAGE)
    assert concurrency == first.num_blocks / 128 and tokens == int(concurrency * 2048)
    assert concurrency > before[1] * 1.5


@pytest.mark.upstream_guard
def test_a_uniform_page_keeps_vllms_grouping(stages, monkeypatch) -> None:
    """Where every page is one size the packed path does not apply: the switch changes nothing."""
    from dataclasses import replace

    from vllm.v1.core.kv_cache_planning import get_kv_cache_groups

    config, per_stage = stages
    specs = {name: spec for stage in per_stage for name, spec in stage.items()}
    drafter = list(specs)[-1]
    # The drafter at 9 KV heads of 64 over 8-token blocks: 18,432 B, the MLA page.
    specs[drafter] = replace(specs[drafter], num_kv_heads=9, block_size=8)
    assert len({spec.page_size_bytes for spec in specs.values()}) == 1
    monkeypatch.delenv(SWITCH, raising=False)
    off = get_kv_cache_groups(config, dict(specs))
    monkeypatch.setenv(SWITCH, "1")
    on = get_kv_cache_groups(config, dict(specs))
    assert on == off and not any(getattr(group, "own_pool_blocks", None) for group in on)
