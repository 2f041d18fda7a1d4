"""Patch 0016: with VLLM_SWA_OWN_POOL=1, sliding-window layers whose pages cannot be unified with the target's keep
their window in a block pool of their own, where vLLM allocates them as full attention.

The pair is rigstack.tinydflash's: a tiny MLA target (DeepSeek-V3 shaped, CPU_MLA's 16-token blocks: 18,432 B
pages) and a tiny DFlash drafter with a 64-token window (CPU attention's smallest block, 32 tokens: 32,768 B
pages, not a multiple, and an MLA page cannot be padded): the GLM-5.3 + DFlash2 case of seed 003 in small. The
in-process tests run vLLM's real EngineArgs config, the target's real layers (vLLM's loader) and a real Attention
layer built as DFlashQwen3Attention builds the drafter's, through vLLM's own grouping, KV-config and KV-cache
manager. The server test boots the pair on the CPU twin (PP=1, float32) with the switch off and on; it skips where
the twin's runner refuses speculative decoding (vLLM 0.34.0's standalone no-Triton CPU runner does).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from rigstack.tinydflash import build_tiny_dflash, build_tiny_mla_target
from testing import tinypair

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")

SWITCH = "VLLM_SWA_OWN_POOL"
WINDOW = 64
SEQS = 4
GIB = 1 << 30
_LOGGED_POOL = re.compile(r"KV cache size: ([\d,]+) tokens")


@pytest.fixture(scope="module")
def pair() -> tuple[Path, Path]:
    target = build_tiny_mla_target()
    return target, build_tiny_dflash(target, sliding_window=WINDOW)


@pytest.fixture(scope="module")
def specs(pair: tuple[Path, Path], single_rank_dist: None) -> tuple[object, dict]:
    """vLLM's config for the pair, each KV layer's spec as the real layer builds it, the layout resolved as the
    engine core resolves it from the CPU backends (LBHNC, layer-outer)."""
    config = tinypair.engine_config(WINDOW, SEQS)
    found = tinypair.layer_specs(config)
    tinypair.resolve_layout(config, found)
    return config, found


def _configs(config: object, specs: dict, monkeypatch: pytest.MonkeyPatch, switch: str | None) -> list:
    """vLLM's planning as the engine core runs it: the whole model's groups, then each worker's config."""
    from vllm.v1.core.kv_cache_planning import get_global_kv_cache_groups, get_kv_cache_configs

    if switch is None:
        monkeypatch.delenv(SWITCH, raising=False)
    else:
        monkeypatch.setenv(SWITCH, switch)
    groups = get_global_kv_cache_groups(config, [dict(specs)])
    return get_kv_cache_configs(config, [dict(specs)], [GIB], groups)


def _drafter_group(kv_config: object, drafter: str) -> object:
    (group,) = [group for group in kv_config.kv_cache_groups if drafter in group.layer_names]
    return group


@pytest.mark.slow
@pytest.mark.upstream_guard
def test_the_pair_is_the_case_vllm_cannot_unify(specs) -> None:
    from vllm.v1.core.kv_cache_planning import unify_kv_cache_spec_page_size
    from vllm.v1.kv_cache_interface import MLAAttentionSpec, SlidingWindowSpec

    _, found = specs
    kinds = {type(spec) for spec in found.values()}
    assert kinds == {MLAAttentionSpec, SlidingWindowSpec}
    pages = sorted({spec.page_size_bytes for spec in found.values()})
    assert pages == [16 * 576 * 2, 32 * 4 * 64 * 2 * 2]  # 18,432 B and 32,768 B: no multiple of each other
    with pytest.raises(NotImplementedError):
        unify_kv_cache_spec_page_size(dict(found))


@pytest.mark.upstream_guard
def test_without_the_switch_the_window_is_allocated_as_full_attention(specs, monkeypatch) -> None:
    from vllm.v1.kv_cache_interface import FullAttentionSpec

    config, found = specs
    (kv_config,) = _configs(config, found, monkeypatch, None)
    (group,) = kv_config.kv_cache_groups
    drafter = next(reversed(found))
    assert isinstance(group.kv_cache_spec.kv_cache_specs[drafter], FullAttentionSpec)
    # Every block holds a full page of the drafter beside the four MLA pages.
    assert kv_config.num_blocks == GIB // (4 * 18_432 + 16 * 4 * 64 * 2 * 2)


def test_the_window_layers_keep_their_window_in_a_pool_of_their_own(specs, monkeypatch) -> None:
    from vllm.utils.math_utils import cdiv
    from vllm.v1.core.kv_cache_utils import generate_scheduler_kv_cache_config, get_kv_cache_capacity
    from vllm.v1.kv_cache_interface import SlidingWindowSpec

    config, found = specs
    drafter = next(reversed(found))
    (kv_config,) = _configs(config, found, monkeypatch, "1")
    group = _drafter_group(kv_config, drafter)
    assert isinstance(group.kv_cache_spec, SlidingWindowSpec) and group.kv_cache_spec.sliding_window == WINDOW
    assert group.layer_names == [drafter]  # no target layer shares its block table
    # max-num-seqs requests each holding its window's most blocks (SlidingWindowSpec's bound: the window plus the
    # in-flight tokens, here one whole 2,048-token batch since CPU MLA runs without chunked prefill, at most
    # max-model-len: 65 blocks of 32), plus the pool's null block.
    assert config.max_in_flight_tokens == 2048
    per_request = cdiv(min(WINDOW - 1 + config.max_in_flight_tokens, 2048), 32) + 1
    own = getattr(group, "own_pool_blocks", None)
    assert own == SEQS * per_request + 1
    # The shared pool: what the own pool leaves, over the four MLA pages a block.
    assert kv_config.num_blocks == (GIB - own * 32_768) // (4 * 18_432)
    (region,) = [tensor for tensor in kv_config.kv_cache_tensors if drafter in tensor.layers]
    assert region.offset == kv_config.num_blocks * 4 * 18_432 and region.block_stride == 32_768
    assert kv_config.num_blocks_of(region) == own
    # Its ids cost the shared pool nothing: a request of max-model-len takes 128 of its blocks.
    tokens, concurrency = get_kv_cache_capacity(config, generate_scheduler_kv_cache_config([kv_config]))
    assert concurrency == kv_config.num_blocks / 128 and tokens == int(concurrency * 2048)


def test_the_scheduler_draws_the_window_blocks_from_their_own_pool(specs, monkeypatch) -> None:
    """vLLM's real KVCacheManager over the patched config: a 200-token request takes cdiv(200, 16) blocks of the
    shared pool and its window's blocks from the drafter's own pool; freeing returns each to its pool."""
    from vllm.sampling_params import SamplingParams
    from vllm.v1.core.kv_cache_manager import KVCacheManager
    from vllm.v1.core.kv_cache_utils import generate_scheduler_kv_cache_config, resolve_kv_cache_block_sizes
    from vllm.v1.request import Request

    config, found = specs
    drafter = next(reversed(found))
    (kv_config,) = _configs(config, found, monkeypatch, "1")
    scheduler_config = generate_scheduler_kv_cache_config([kv_config])
    scheduler_block, hash_block = resolve_kv_cache_block_sizes(scheduler_config, config)
    manager = KVCacheManager(scheduler_config, max_model_len=2048, scheduler_block_size=scheduler_block,
                             hash_block_size=hash_block, max_in_flight_tokens=config.max_in_flight_tokens,
                             enable_caching=False)
    group_id = [i for i, group in enumerate(scheduler_config.kv_cache_groups) if drafter in group.layer_names][0]
    shared = manager.block_pool
    free_before = shared.get_num_free_blocks()
    request = Request("r", list(range(200)), SamplingParams(max_tokens=1), pooling_params=None)
    assert manager.allocate_slots(request, 200) is not None
    blocks = manager.coordinator.get_blocks("r")
    assert free_before - shared.get_num_free_blocks() == 13  # cdiv(200, 16): the target's blocks only
    own_pool = blocks[group_id][0].pool()  # a block holds its pool by weak reference
    assert own_pool is not shared and {block.pool() for block in blocks[group_id]} == {own_pool}
    assert own_pool.num_gpu_blocks - 1 - own_pool.get_num_free_blocks() == 7  # cdiv(200, 32)
    manager.free(request)
    assert shared.get_num_free_blocks() == free_before
    assert own_pool.get_num_free_blocks() == own_pool.num_gpu_blocks - 1


# --- the CPU twin: the pair served, switch off and on ----------------------------------------------------------

PROMPTS = ("The red fox jumps over", "Once upon a time there", "alpha beta gamma delta")


def _profile(tmp_path: Path, pair: tuple[Path, Path], switch: bool) -> Path:
    target, draft = pair
    env = f"\n  {SWITCH}: \"1\"" if switch else ""
    text = f"""description: tiny MLA target and sliding-window DFlash drafter (patch 0016's test)
flavour: cpu
hardware:
  host_ram_gib: 4
model:
  path: {target}
  served_name: tiny
drafter:
  path: {draft}
env:
  VLLM_CPU_KVCACHE_SPACE: "1"{env}
vllm:
  dtype: float32
  block-size: 16
  attention-backend: CPU_MLA
  max-model-len: 2048
  max-num-seqs: {SEQS}
  # vLLM's CPU platform turns chunked prefill off for MLA, so a batch is max-model-len tokens, and schedules
  # without async (one batch in flight).
  max-num-batched-tokens: 2048
  async-scheduling: false
  speculative-config: {{method: dflash, num_speculative_tokens: 3}}
"""
    path = tmp_path / f"pair-{int(switch)}.yaml"
    path.write_text(text)
    return path


def _serve(vllm_server, target: Path, extra: list[str], switch: bool, top: int = 0) -> dict:
    import httpx

    # TRITON_INTERPRET=1: the twin serves with the V2 runner the rigs run (its Triton kernels interpreted); its
    # standalone CPU runner refuses speculative decoding (twin/README.md).
    server = vllm_server(model=target, env={SWITCH: "1" if switch else "0", "TRITON_INTERPRET": "1"},
                         extra_args=["--dtype", "float32", "--max-num-seqs", str(SEQS), "--block-size", "16",
                                     "--attention-backend", "CPU_MLA", *extra])
    answers = [server.completion(prompt, max_tokens=24, logprobs=top)["choices"][0]["logprobs"] for prompt in PROMPTS]
    tokens = [answer["tokens"] for answer in answers]
    tops = [answer["top_logprobs"] for answer in answers]
    metrics = httpx.get(server.url + "/metrics", timeout=30).text
    counters: dict[str, float] = {}
    for line in metrics.splitlines():  # name{labels} value: summed over the labels
        if line.startswith("vllm:spec_decode_num_") and "_created" not in line:
            name = line.split("{")[0].split(" ")[0]
            counters[name] = counters.get(name, 0.0) + float(line.rsplit(" ", 1)[1])
    return {"tokens": tokens, "tops": tops, "counters": counters, "log": server.log.read_text()}


# Served in float32: a verify pass over 4 tokens and a decode step sum in other orders, so the target's two best
# tokens may swap only where they are this close. In bfloat16 the same paths differed by 0.125 nats at a logit of
# -3.8 (a CI run), which no honest bound separates from a drafter that corrupts the target's KV.
TIE_NATS = 1e-3


def _same_greedy_path(spec: list[list[str]], alone: list[list[str]], tops: list[list[dict[str, float]]]) -> int:
    """Asserts each speculative answer is the target's own greedy answer up to its first near tie (then the two
    contexts differ and are not compared); returns how many tokens were compared equal."""
    equal = 0
    for got, want, top in zip(spec, alone, tops):
        for position, (token, wanted) in enumerate(zip(got, want)):
            if token != wanted:
                best = top[position]
                assert token in best and best[wanted] - best[token] <= TIE_NATS, (position, token, wanted, best)
                break
            equal += 1
    return equal


def _logged_pool(log: str) -> int:
    logged = _LOGGED_POOL.findall(log)
    assert logged, "no 'KV cache size' line in the server's log"
    return int(logged[-1].replace(",", ""))


@pytest.mark.server
def test_served_pool_equals_the_plan_and_tokens_equal_the_targets_alone(vllm_server, pair, tmp_path) -> None:
    """Switch on, the pair serves: its logged pool is the plan's, and greedy speculative decoding gives the target's
    own greedy tokens (served without the drafter) up to a near tie of its two best, with drafts proposed. Switch
    off, vLLM logs the full-attention pool (the plan's too) and cannot serve the pair at all: the promoted
    drafter layer joins the MLA layers' 16-token blocks, which the CPU attention kernel (multiples of 32) cannot
    take."""
    from rigstack.serving.ready import ServerDied
    from rigstack.planner.profile_plan import plan_for

    target, draft = pair
    spec = ["--speculative-config", f'{{"method": "dflash", "model": "{draft}", "num_speculative_tokens": 3}}']
    on = _serve(vllm_server, target, spec, switch=True)
    assert "keep their 64-token window in a pool of their own" in on["log"]
    assert plan_for(str(_profile(tmp_path, pair, True)))["pool_tokens"] == _logged_pool(on["log"])
    alone = _serve(vllm_server, target, [], switch=False, top=3)
    # Most of the 72 tokens agree before any near tie: a drafter that corrupted the target's KV would not.
    equal = _same_greedy_path(on["tokens"], alone["tokens"], alone["tops"])
    print("FIGURES 0016", {"equal_tokens_of_72": equal, **on["counters"]})
    assert equal >= 24
    drafts = on["counters"]["vllm:spec_decode_num_drafts_total"]
    assert drafts > 0 and on["counters"]["vllm:spec_decode_num_draft_tokens_total"] == 3 * drafts
    with pytest.raises(ServerDied) as died:
        _serve(vllm_server, target, spec, switch=False)
    off_log = Path(re.search(r"full log: (\S+)", str(died.value)).group(1)).read_text()
    assert "treating sliding-window layers as full attention" in off_log
    assert "No common block size for 16 (CPU_MLA: [16]; CPU_ATTN: [MultipleOf(32)])" in off_log
    assert plan_for(str(_profile(tmp_path, pair, False)))["pool_tokens"] == _logged_pool(off_log)
    assert _logged_pool(on["log"]) > _logged_pool(off_log)
