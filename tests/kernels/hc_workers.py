"""Rank processes for the host-collectives tests (patch 0011): each attaches to the shared segment and runs calls.

Spawned children import this module and the materialised host_collectives module by name (sys.path is inherited).
Every rank can rebuild every rank's input from the call's seed, so each checks the result on its own.
"""

from __future__ import annotations

import importlib
import os
from typing import Any

import torch

CAPACITY = 8 << 20
CHUNK = 64 << 10


def rank_inputs(world: int, n: int, seed: int, dtype: torch.dtype, integral: bool) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    if integral:  # small integers: every order of summation is exact, so the sum is checkable bit for bit
        return [torch.randint(-64, 64, (n,), generator=g).to(dtype) for _ in range(world)]
    return [torch.randn(n, generator=g).to(dtype) for _ in range(world)]


def open_comm(module: str, rank: int, world: int, name: str, **kwargs: Any):
    hc = importlib.import_module(module)
    return hc, hc.HostCollectives(rank, world, name, "cpu", create=False, capacity_bytes=CAPACITY,
                                  chunk_bytes=CHUNK, **kwargs)


def exact_calls(module: str, rank: int, world: int, name: str, sizes: list[int], queue) -> None:
    """All-reduce and all-gather of every size, float32 and bfloat16: results must equal the reference exactly."""
    _, comm = open_comm(module, rank, world, name, timeout_s=30)
    wrong = []
    for call, n in enumerate(sizes):
        for dtype in (torch.float32, torch.bfloat16):
            xs = rank_inputs(world, n, call, dtype, integral=True)
            reduced = comm.all_reduce(xs[rank])
            if not torch.equal(reduced, sum(x.double() for x in xs).to(dtype)):
                wrong.append(("all_reduce", n, str(dtype)))
            gathered = comm.all_gather(xs[rank].view(1, n), dim=1)
            if not torch.equal(gathered.view(-1), torch.cat(xs)):
                wrong.append(("all_gather", n, str(dtype)))
        if n % 5 == 0:  # a non-contiguous view is flattened, not refused
            xs = [x.view(5, -1).t() for x in rank_inputs(world, n, call, torch.float32, integral=True)]
            if not torch.equal(comm.all_reduce(xs[rank]), sum(x.double() for x in xs).float()):
                wrong.append(("all_reduce transposed", n))
    comm.close()
    queue.put((rank, wrong))


def int8_calls(module: str, rank: int, world: int, name: str, sizes: list[int], queue) -> None:
    """INT8 all-reduces: each element within the stated bound, sum over ranks of absmax(block) / 254."""
    hc, comm = open_comm(module, rank, world, name, timeout_s=30, int8_threshold_bytes=1 << 16)
    worst = []
    for call, n in enumerate(sizes):
        xs = rank_inputs(world, n, 1000 + call, torch.float32, integral=False)
        reduced = comm.all_reduce(xs[rank])
        if xs[rank].nbytes < comm.int8_threshold:  # the exact path: the float32 sum in rank order
            worst.append((n, float((reduced - sum(xs[1:], xs[0])).abs().max()), 0.0))
            continue
        exact = sum(x.double() for x in xs)
        pad = (-n) % hc.INT8_BLOCK
        bound = sum(torch.nn.functional.pad(x.double().abs(), (0, pad)).view(-1, hc.INT8_BLOCK).amax(1)
                    for x in xs).repeat_interleave(hc.INT8_BLOCK)[:n] / 254
        error = (reduced.double() - exact).abs()
        worst.append((n, float(error.max()), float((error / (bound * (1 + 1e-6) + 1e-30)).max())))
    comm.close()
    queue.put((rank, worst))


def dies_mid_call(module: str, rank: int, world: int, name: str, queue) -> None:
    """Rank 1 writes its input for the third call and dies; the others must time out with a clear error."""
    # The timeout bounds the healthy calls too: 3 s timed out call 1 on a CI box loaded by a second run.
    hc, comm = open_comm(module, rank, world, name, timeout_s=15)
    x = torch.ones(300_000)
    for call in range(3):
        if call == 2 and rank == 1:
            comm._engine.wait = _die_on_second(comm._engine.wait)
        try:
            comm.all_reduce(x)
        except hc.HostCollectiveError as error:
            queue.put((rank, call, str(error)))
            return
    queue.put((rank, None, "finished"))


def _die_on_second(wait):
    """The first wait of a call passes; the next one ends the process: it has written its input and signalled."""
    seen = []

    def wrapper(*args, **kwargs):
        seen.append(args)
        if len(seen) > 1:
            os._exit(0)
        return wait(*args, **kwargs)

    return wrapper
