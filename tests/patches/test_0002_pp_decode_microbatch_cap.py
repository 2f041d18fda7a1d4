"""Patch 0002: VLLM_PP_MAX_DECODE_REQS_PER_BATCH caps the decodes per scheduled batch (real vLLM Scheduler)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

ENV = "VLLM_PP_MAX_DECODE_REQS_PER_BATCH"
BLOCK = 16
PROMPT = list(range(1, 33))  # two full KV blocks: each request's first decode needs a third


@pytest.fixture
def make_scheduler(tiny_model: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """A real Scheduler over the tiny model's config, as EngineCore builds it, with the cap from the env."""
    import torch
    from vllm.config import CacheConfig, ModelConfig, ParallelConfig, SchedulerConfig, VllmConfig
    from vllm.v1.core.sched.scheduler import Scheduler
    from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
    from vllm.v1.structured_output import StructuredOutputManager

    def make(cap: str | None, pp: int = 1, num_blocks: int = 200, scheduler_cls: type = Scheduler) -> Any:
        if cap is None:
            monkeypatch.delenv(ENV, raising=False)
        else:
            monkeypatch.setenv(ENV, cap)
        config = VllmConfig(
            model_config=ModelConfig(model=str(tiny_model), max_model_len=256),
            scheduler_config=SchedulerConfig(max_num_seqs=16, max_num_batched_tokens=512, max_model_len=256,
                                             is_encoder_decoder=False),
            cache_config=CacheConfig(block_size=BLOCK, enable_prefix_caching=False),
            parallel_config=ParallelConfig(pipeline_parallel_size=pp))
        config.cache_config.num_gpu_blocks = num_blocks
        spec = FullAttentionSpec(block_size=BLOCK, num_kv_heads=2, head_size=64, dtype=torch.bfloat16)
        kv_cache = KVCacheConfig(num_blocks=num_blocks, kv_cache_tensors=[],
                                 kv_cache_groups=[KVCacheGroupSpec(["layer.0"], spec)])
        return scheduler_cls(vllm_config=config, kv_cache_config=kv_cache,
                             structured_output_manager=StructuredOutputManager(config), block_size=BLOCK)

    yield make


def _add(scheduler: Any, count: int, max_tokens: int = 50, first: int = 0) -> list[str]:
    from vllm import SamplingParams
    from vllm.v1.request import Request

    ids = [f"r{i}" for i in range(first, first + count)]
    for request_id in ids:
        scheduler.add_request(Request(request_id=request_id, prompt_token_ids=list(PROMPT), pooling_params=None,
                                      sampling_params=SamplingParams(max_tokens=max_tokens, ignore_eos=True)))
    return ids


def _finish(scheduler: Any, batch: Any) -> list[Any]:
    """Hand a batch's result back, as the engine does when the last PP stage returns: one token per request.

    Returns the engine's per-request outputs (EngineCoreOutput)."""
    from vllm.v1.outputs import ModelRunnerOutput

    ids = list(batch.num_scheduled_tokens)
    outputs = scheduler.update_from_output(batch, ModelRunnerOutput(req_ids=ids, sampled_token_ids=[[7] for _ in ids]))
    return [output for client in outputs.values() for output in client.outputs]


def _decodes(batch: Any) -> set[str]:
    return {request_id for request_id, tokens in batch.num_scheduled_tokens.items() if tokens == 1}


def _prefilled(scheduler: Any, count: int) -> list[str]:
    ids = _add(scheduler, count)
    _finish(scheduler, scheduler.schedule())  # every prompt fits one step: all are decodes from here on
    return ids


@pytest.mark.slow
def test_cap_spreads_decodes_over_pp_microbatches(make_scheduler: Any) -> None:
    # PP=2 keeps two batches in flight: the engine schedules the second before the first returns.
    scheduler = make_scheduler("2", pp=2)
    ids = _prefilled(scheduler, 4)
    first, second = scheduler.schedule(), scheduler.schedule()
    assert _decodes(first) == set(ids[:2])
    assert _decodes(second) == set(ids[2:])
    _finish(scheduler, first)
    assert _decodes(scheduler.schedule()) == set(ids[:2])


def test_cap_rotates_so_no_decode_starves(make_scheduler: Any) -> None:
    # Cap 1 with PP=1: the request at the head of the queue is always ready again, yet each waits its turn.
    scheduler = make_scheduler("1")
    ids = _prefilled(scheduler, 3)
    served = []
    for _ in range(9):
        batch = scheduler.schedule()
        assert len(_decodes(batch)) == 1
        served += sorted(_decodes(batch))
        _finish(scheduler, batch)
    assert served == ids * 3


def test_requests_finish_under_the_cap(make_scheduler: Any) -> None:
    scheduler = make_scheduler("2")
    ids = _add(scheduler, 5, max_tokens=4)
    tokens = dict.fromkeys(ids, 0)
    finished = set()
    for _ in range(40):
        batch = scheduler.schedule()
        assert len(_decodes(batch)) <= 2
        for output in _finish(scheduler, batch):
            tokens[output.request_id] += len(output.new_token_ids)
            if output.finish_reason is not None:
                finished.add(output.request_id)
        if not scheduler.has_requests():
            break
    assert finished == set(ids)
    assert tokens == dict.fromkeys(ids, 4)


def test_skipped_decodes_allocate_and_preempt_nothing(make_scheduler: Any) -> None:
    # 12 blocks: the 4 prompts fill 8; one more decode block each would fit, so nothing needs preempting anyway.
    scheduler = make_scheduler("1", num_blocks=12)
    ids = _prefilled(scheduler, 4)
    manager = scheduler.kv_cache_manager
    free_before = manager.block_pool.get_num_free_blocks()
    batch = scheduler.schedule()
    assert _decodes(batch) == {ids[0]}
    assert not batch.preempted_req_ids
    assert all(scheduler.requests[i].status.name == "RUNNING" for i in ids)
    # Only the scheduled decode took its third block; the skipped ones took nothing.
    assert [len(manager.get_block_ids(i)[0]) for i in ids] == [3, 2, 2, 2]
    assert manager.block_pool.get_num_free_blocks() == free_before - 1


def test_prefills_are_not_capped(make_scheduler: Any) -> None:
    scheduler = make_scheduler("1")
    running = _prefilled(scheduler, 3)
    new = _add(scheduler, 2, first=3)
    batch = scheduler.schedule()
    assert _decodes(batch) == {running[0]}
    assert {i for i, tokens in batch.num_scheduled_tokens.items() if tokens == len(PROMPT)} == set(new)


@pytest.mark.parametrize("value", ["two", "-1", "1.5"])
def test_bad_value_is_refused_at_startup(make_scheduler: Any, value: str) -> None:
    with pytest.raises(ValueError, match=ENV):
        make_scheduler(value)


@pytest.mark.upstream_guard
@pytest.mark.parametrize("value", [None, "", "0"])
def test_unset_or_zero_keeps_upstream_schedule(make_scheduler: Any, value: str | None) -> None:
    scheduler = make_scheduler(value, pp=2)
    ids = _prefilled(scheduler, 4)
    first, second = scheduler.schedule(), scheduler.schedule()
    assert _decodes(first) == set(ids)
    assert not second.num_scheduled_tokens


def test_async_scheduler_rotates_under_the_cap(make_scheduler: Any) -> None:
    # The async scheduler (GPU default) schedules a decode again before its token is back; the cap still rotates.
    from vllm.v1.core.sched.async_scheduler import AsyncScheduler

    scheduler = make_scheduler("1", scheduler_cls=AsyncScheduler)
    ids = _prefilled(scheduler, 3)
    batches = [scheduler.schedule() for _ in range(3)]
    assert [_decodes(batch) for batch in batches] == [{i} for i in ids]
    for batch in batches:
        _finish(scheduler, batch)
    assert _decodes(scheduler.schedule()) == {ids[0]}
