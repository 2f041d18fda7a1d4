"""Patch 0003: VLLM_STAGE_TIMING=1 times each worker step per PP stage; off, the worker is untouched.

The end-to-end check (timing lines from both stages of a real PP=2 server) is in test_e2e_pp.py.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import pytest

from testing.stagelog import timing_lines
from testing.worker import scheduler_output

ENV = "VLLM_STAGE_TIMING"


def test_worker_steps_are_timed_when_on(make_worker: Any) -> None:
    from vllm.v1.worker.gpu_worker import Worker

    worker = make_worker("1")
    # The wiring first, before the new module is imported: with the switch on, the worker's step is its own
    # attribute (the pristine worker ignores the switch and keeps the class's method).
    assert "execute_model" in vars(worker)
    from vllm.v1.worker.stage_timing import StageTimer

    timer = worker.execute_model
    assert isinstance(timer, StageTimer)
    # It wraps this worker's own step, so the RPC "execute_model" still reaches Worker.execute_model.
    assert timer._execute_model.__self__ is worker
    assert timer._execute_model.__func__ is Worker.execute_model


@pytest.mark.upstream_guard
@pytest.mark.parametrize("value", [None, "0"])
def test_worker_untouched_when_off(make_worker: Any, value: str | None) -> None:
    from vllm.v1.worker.gpu_worker import Worker

    worker = make_worker(value)
    assert "execute_model" not in vars(worker)
    assert worker.execute_model.__func__ is Worker.execute_model


def test_timer_logs_one_greppable_line_per_step(caplog: pytest.LogCaptureFixture) -> None:
    from vllm.v1.worker.stage_timing import StageTimer

    calls = []

    def stage(batch: Any) -> str:
        calls.append(batch)
        time.sleep(0.02)
        return f"out-{len(calls)}"

    ranks = []
    timer = StageTimer(stage, use_cuda_events=False, pp_rank=lambda: ranks.append(1) or 1)
    batches = [scheduler_output(8), scheduler_output(1), scheduler_output(0), scheduler_output(3)]
    with caplog.at_level(logging.INFO):
        outputs = [timer(batch) for batch in batches]
    assert outputs == ["out-1", "out-2", "out-3", "out-4"]
    assert calls == batches
    lines = timing_lines(caplog)
    # Steps without tokens (PP bubbles, empty batches) are counted but not logged.
    assert [(rank, step, tokens) for rank, step, tokens, _ in lines] == [(1, 1, 8), (1, 2, 1), (1, 4, 3)]
    assert all(20.0 <= ms < 2000.0 for *_, ms in lines)
    assert ranks == [1]  # the rank is looked up once, on the first logged step


