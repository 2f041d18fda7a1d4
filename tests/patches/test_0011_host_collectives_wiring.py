"""Patch 0011: vLLM's own CpuCommunicator routes the TP group's all-reduce and all-gather through the host buffer
when VLLM_HOST_COLLECTIVES=1, and keeps its stock path otherwise. Two real processes, a real gloo group."""

from __future__ import annotations

import multiprocessing as mp
import os
import pytest

from testing.net import free_port


def _rank(rank: int, port: int, switch: str, queue) -> None:
    os.environ["VLLM_HOST_COLLECTIVES"] = switch
    import torch
    import torch.distributed as dist
    from vllm.distributed.device_communicators.cpu_communicator import CpuCommunicator

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    try:
        group = dist.group.WORLD
        comm = CpuCommunicator(cpu_group=group, device=torch.device("cpu"), device_group=group, unique_name="tp:0")
        xs = [torch.arange(1000, dtype=torch.float32) * (r + 1) for r in range(2)]
        reduced = comm.all_reduce(xs[rank].clone())
        gathered = comm.all_gather(xs[rank].view(10, 100), dim=1)
        host = getattr(comm, "host_comm", None)
        queue.put((rank, type(host).__name__ if host is not None else None,
                   getattr(getattr(host, "_engine", None), "seq", 0),
                   torch.equal(reduced, xs[0] + xs[1]),
                   torch.equal(gathered, torch.cat([x.view(10, 100) for x in xs], dim=1))))
    finally:
        dist.destroy_process_group()


def _run(switch: str) -> list[tuple]:
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=_rank, args=(rank, port, switch, queue)) for rank in range(2)]
    for proc in procs:
        proc.start()
    results = sorted(queue.get(timeout=300) for _ in procs)
    for proc in procs:
        proc.join(timeout=60)
    return results


def test_the_switch_routes_tp_collectives_through_host_memory() -> None:
    for rank, kind, calls, reduced_ok, gathered_ok in _run("1"):
        assert kind == "HostCollectives", f"rank {rank}: no host collectives on the TP group"
        assert calls == 2  # the all-reduce and the all-gather both went through it
        assert reduced_ok and gathered_ok


@pytest.mark.upstream_guard
def test_without_the_switch_the_stock_path_serves() -> None:
    for _rank, kind, _, reduced_ok, gathered_ok in _run("0"):
        assert kind is None
        assert reduced_ok and gathered_ok
