"""Inputs for tests that drive a real vLLM worker."""

from __future__ import annotations

import dataclasses
from typing import Any


def scheduler_output(tokens: int) -> Any:
    """An empty SchedulerOutput that claims `tokens` scheduled tokens: what the stage timer reads."""
    from vllm.v1.core.sched.output import SchedulerOutput

    return dataclasses.replace(SchedulerOutput.make_empty(), total_num_scheduled_tokens=tokens)
