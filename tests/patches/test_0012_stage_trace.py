"""Patch 0012: VLLM_STAGE_TRACE=DIR writes each stage's steps as a Chrome trace; off, the worker is untouched."""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path
from typing import Any

import pytest

from testing.stagelog import trace_events
from testing.worker import scheduler_output

ENV = "VLLM_STAGE_TRACE"


def _timer(stage: Any, folder: Path, pp_rank: int) -> Any:
    from vllm.v1.worker.stage_timing import StageTimer, trace_writer

    return StageTimer(stage, use_cuda_events=False, pp_rank=lambda: pp_rank, log_lines=False,
                      trace=trace_writer(str(folder)))


def test_worker_steps_are_traced_when_on(make_worker: Any, tmp_path: Path,
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    from vllm.v1.worker.gpu_worker import Worker
    from vllm.v1.worker.stage_timing import StageTimer

    folder = tmp_path / "trace" / "run1"
    monkeypatch.setenv(ENV, str(folder))
    worker = make_worker(None)  # VLLM_STAGE_TIMING unset: the trace alone turns the timer on
    timer = worker.execute_model
    assert isinstance(timer, StageTimer)
    assert timer._execute_model.__func__ is Worker.execute_model
    assert folder.is_dir()


@pytest.mark.upstream_guard
@pytest.mark.parametrize("value", [None, "", "0"])
def test_worker_untouched_when_off(make_worker: Any, monkeypatch: pytest.MonkeyPatch,
                                   value: str | None) -> None:
    if value is None:
        monkeypatch.delenv(ENV, raising=False)
    else:
        monkeypatch.setenv(ENV, value)
    worker = make_worker(None)
    assert "execute_model" not in vars(worker)


@pytest.mark.parametrize("value, message", [("1", "takes the folder"), ("FILE/sub", "cannot create the trace folder")])
def test_bad_value_fails_at_worker_start_naming_the_switch(make_worker: Any, tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch, value: str,
                                                           message: str) -> None:
    (tmp_path / "FILE").write_text("a file, not a folder")
    monkeypatch.setenv(ENV, value.replace("FILE", str(tmp_path / "FILE")))
    with pytest.raises(ValueError, match=f"^{ENV}=.*{message}"):
        make_worker(None)


def test_trace_is_one_timeline_event_per_step_per_stage(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    def stage(batch: Any) -> int:
        time.sleep(0.02)
        return batch.total_num_scheduled_tokens

    before_us = time.time() * 1e6
    first, last = _timer(stage, tmp_path, 0), _timer(stage, tmp_path, 1)
    with caplog.at_level(logging.INFO):
        for tokens in (8, 0, 3):
            assert first(scheduler_output(tokens)) == tokens
            assert last(scheduler_output(tokens)) == tokens
    after_us = time.time() * 1e6
    assert not [r for r in caplog.records if "stage_timing" in r.getMessage()]  # VLLM_STAGE_TIMING is off

    files = sorted(tmp_path.glob("stage_trace.pp*.json"))
    assert [f.name for f in files] == [f"stage_trace.pp{rank}.{os.getpid()}.json" for rank in (0, 1)]
    for rank, path in enumerate(files):
        meta, *steps = trace_events(path)
        assert meta == {"name": "process_name", "ph": "M", "pid": rank, "args": {"name": f"pp_rank {rank}"}}
        # Steps without tokens are counted, not traced.
        assert [(e["name"], e["ph"], e["pid"], e["tid"], e["args"]) for e in steps] == [
            ("step", "X", rank, os.getpid(), {"step": 1, "tokens": 8}),
            ("step", "X", rank, os.getpid(), {"step": 3, "tokens": 3}),
        ]
        # Wall-clock microseconds: inside the run, each step at least its 20 ms sleep, in order.
        assert all(20_000 <= e["dur"] < 2_000_000 for e in steps)
        assert before_us <= steps[0]["ts"] and steps[0]["ts"] + steps[0]["dur"] <= steps[1]["ts"]
        assert steps[1]["ts"] + steps[1]["dur"] <= after_us + 1


def test_timing_and_trace_together_log_and_trace_the_same_steps(tmp_path: Path,
                                                                 caplog: pytest.LogCaptureFixture) -> None:
    from vllm.v1.worker.stage_timing import StageTimer, trace_writer

    timer = StageTimer(lambda batch: None, use_cuda_events=False, pp_rank=lambda: 0,
                       trace=trace_writer(str(tmp_path)))
    with caplog.at_level(logging.INFO):
        timer(scheduler_output(5))
    assert [r.getMessage().split(" ms=")[0] for r in caplog.records if "stage_timing" in r.getMessage()] == [
        "stage_timing pp_rank=0 step=1 tokens=5"]
    (path,) = tmp_path.glob("stage_trace.pp0.*.json")
    assert [e["args"] for e in trace_events(path)[1:]] == [{"step": 1, "tokens": 5}]


