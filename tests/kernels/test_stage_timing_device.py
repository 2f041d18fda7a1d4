"""Patches 0003 and 0012 on a GPU: the stage timer's CUDA-event clock logs finished steps without syncing, and the
trace places them on the wall clock. The timer module is the package's own (patched), loaded without vLLM, which the
GPU machine lacks (rigstack.bench.kernel_sources.load_stage_timing: only its logger and platform check stand in);
the CPU-clock tests and the worker wiring are in tests/patches/test_0003_stage_timing.py and test_0012_stage_trace.py.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from rigstack.bench import kernel_sources
from testing.stagelog import timing_lines, trace_events

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (the CUDA-event clock)")


@pytest.fixture(scope="module")
def st() -> Any:
    return kernel_sources.load_stage_timing()


def _batch(tokens: int) -> SimpleNamespace:
    """What the timer reads of a SchedulerOutput."""
    return SimpleNamespace(total_num_scheduled_tokens=tokens)


def _stage() -> Any:
    a = torch.randn(4096, 4096, device="cuda")

    def stage(batch: SimpleNamespace) -> torch.Tensor:
        for _ in range(20):
            b = a @ a
        return b
    return stage


def test_the_loaded_timer_is_the_packages_on_the_cpu_clock(st: Any, caplog: pytest.LogCaptureFixture) -> None:
    """Where CI runs it (no GPU): the module loaded without vLLM times and logs a step as the package's own does."""
    timer = st.StageTimer(lambda batch: time.sleep(0.01), use_cuda_events=False, pp_rank=lambda: 2)
    with caplog.at_level(logging.INFO):
        timer(_batch(7))
    ((rank, step, tokens, ms),) = timing_lines(caplog)
    assert (rank, step, tokens) == (2, 1, 7) and 10.0 <= ms < 2000.0


@pytest.mark.gpu
@needs_cuda
def test_cuda_timer_logs_finished_steps_without_syncing(st: Any, caplog: pytest.LogCaptureFixture) -> None:
    timer = st.StageTimer(_stage(), use_cuda_events=True, pp_rank=lambda: 0)
    with caplog.at_level(logging.INFO):
        for _ in range(3):
            timer(_batch(16))
        torch.cuda.synchronize()
        timer(_batch(0))  # the next step reports the ones that finished meanwhile
    lines = timing_lines(caplog)
    assert [(rank, step, tokens) for rank, step, tokens, _ in lines] == [(0, 1, 16), (0, 2, 16), (0, 3, 16)]
    assert all(ms > 0.0 for *_, ms in lines)


@pytest.mark.gpu
@needs_cuda
def test_cuda_steps_are_placed_on_the_wall_clock(st: Any, tmp_path: Path) -> None:
    timer = st.StageTimer(_stage(), use_cuda_events=True, pp_rank=lambda: 0, log_lines=False,
                          trace=st.trace_writer(str(tmp_path)))
    before_us = time.time() * 1e6
    for _ in range(3):
        timer(_batch(16))
    torch.cuda.synchronize()
    after_us = time.time() * 1e6
    timer(_batch(0))  # the next step writes the ones that finished meanwhile
    (path,) = tmp_path.glob("stage_trace.pp0.*.json")
    steps = trace_events(path)[1:]
    assert [e["args"]["step"] for e in steps] == [1, 2, 3]
    assert all(e["dur"] > 0 for e in steps)
    assert all(before_us - 1_000 <= e["ts"] <= after_us for e in steps)
    assert all(x["ts"] + x["dur"] <= y["ts"] + 1 for x, y in zip(steps, steps[1:]))
