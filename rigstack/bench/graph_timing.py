"""Timing a captured CUDA graph by CUDA events, for the kernel benchmarks (torch only, so any bench may import it
without pulling another bench's Triton kernels into its process)."""

from __future__ import annotations

import statistics
from collections.abc import Callable

import torch


def capture(steps: Callable[[], None]) -> torch.cuda.CUDAGraph:
    """Capture `steps` (a callable running every step of one replay) after one warm-up run outside the capture."""
    steps()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        steps()
    return graph


def replay_seconds(graph: torch.cuda.CUDAGraph, reps: int) -> float:
    """Median seconds of ``reps`` timed replays (after one warm-up replay), each timed by CUDA events."""
    graph.replay()
    times = []
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    for _ in range(reps):
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    return statistics.median(times)


def replay_gbps(graph: torch.cuda.CUDAGraph, nbytes: int, reps: int) -> float:
    """Median GB/s of ``reps`` timed replays moving ``nbytes`` each."""
    return nbytes / replay_seconds(graph, reps) / 1e9
