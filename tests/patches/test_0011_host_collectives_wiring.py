"""Patch 0011: vLLM's own CpuCommunicator and CudaCommunicator route the TP group's all-reduce and all-gather
through the host buffer when VLLM_HOST_COLLECTIVES=1, and keep their stock path otherwise. Real processes, a real
gloo group. CudaCommunicator's NCCL is stubbed at its boundary (PyNcclCommunicator, the one class it would load
libnccl through) and its device is the CPU, so the host buffer runs its CPU engine: the same protocol and sums as
the CUDA engine, whose streams and kernels only tests/kernels/hc_gpu_check.py runs (on a GPU)."""

from __future__ import annotations

import multiprocessing as mp
import os
from typing import Any

import pytest

from rigstack.profiles import load_profile
from testing.net import free_port

pytestmark = pytest.mark.slow  # each test starts ranks that import vLLM (25-55 s each)
RIG = "l40-8x-tp8"  # the rig patch 0011 is for


def _rank(rank: int, world: int, port: int, switch: str, queue: Any) -> None:
    os.environ["VLLM_HOST_COLLECTIVES"] = switch
    import torch
    import torch.distributed as dist
    from vllm.distributed.device_communicators.cpu_communicator import CpuCommunicator

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
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


def _run(target: Any, switch: str, world: int = 2, *args: Any) -> list[tuple]:
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=target, args=(rank, world, port, switch, queue, *args)) for rank in range(world)]
    for proc in procs:
        proc.start()
    results = sorted(queue.get(timeout=300) for _ in procs)
    for proc in procs:
        proc.join(timeout=60)
    return results


def test_the_switch_routes_tp_collectives_through_host_memory() -> None:
    for rank, kind, calls, reduced_ok, gathered_ok in _run(_rank, "1"):
        assert kind == "HostCollectives", f"rank {rank}: no host collectives on the TP group"
        assert calls == 2  # the all-reduce and the all-gather both went through it
        assert reduced_ok and gathered_ok


@pytest.mark.upstream_guard
def test_without_the_switch_the_stock_path_serves() -> None:
    for _, kind, _, reduced_ok, gathered_ok in _run(_rank, "0"):
        assert kind is None
        assert reduced_ok and gathered_ok


# --- CudaCommunicator (the L40 rig's path) --------------------------------------------------------------------


def _rig_shapes() -> dict[str, tuple[int, ...]]:
    """One rank's tensors on the L40 rig (bf16, the model's dtype): a decode step's all-reduce (max-num-seqs 8 x
    (1 + 3 MTP tokens) x hidden 4096), a prefill chunk's (vLLM's default 2,048 batched tokens for a GPU under
    70 GiB serving the API, the profile setting none) and the logits' all-gather (vocab / TP a rank)."""
    profile = load_profile(RIG)
    hidden, vocab = profile.model.shape.hidden_size, profile.model.shape.vocab_size
    decode = profile.vllm["max-num-seqs"] * (1 + profile.vllm["speculative-config"]["num_speculative_tokens"])
    return {"decode": (decode, hidden), "prefill": (2048, hidden), "logits": (decode, vocab // profile.parallel.tp)}


def _order_sensitive(world: int, shape: tuple[int, ...], seed: int) -> list[Any]:
    """bf16 inputs whose float32 sum depends on the order: magnitudes 2^-12..2^12, and in every fourth element
    a large value, a small one and the large one negated on ranks 0, 1, 2 (in rank order the small one is lost;
    rank 0 + rank 2 first keeps it)."""
    import torch

    g = torch.Generator().manual_seed(seed)
    xs = [torch.randn(shape, generator=g) * 2.0 ** torch.randint(-12, 13, shape, generator=g) for _ in range(world)]
    flat = [x.view(-1) for x in xs]
    flat[0][::4], flat[1][::4], flat[2][::4] = 2.0**25, 1.0, -(2.0**25)
    return [x.to(torch.bfloat16) for x in xs]


def _in_rank_order(xs: list[Any]) -> Any:
    """The sum patch 0011 promises: float32, rank 0 first, then 1, then 2, ..., rounded once to the input's dtype."""
    total = xs[0].float()
    for x in xs[1:]:
        total = total + x.float()
    return total.to(xs[0].dtype)


class _NcclStandIn:
    """PyNcclCommunicator at its boundary (no libnccl on CPU): the same collectives over the gloo group, each call
    recorded, so a test sees what reached NCCL."""

    calls: list[tuple[str, tuple[int, ...]]] = []

    def __init__(self, group: Any, device: Any) -> None:
        import torch.distributed as dist

        self.group, self.world_size, self.disabled = group, dist.get_world_size(group), False

    def all_reduce(self, x: Any) -> Any:
        import torch.distributed as dist

        self.calls.append(("all_reduce", tuple(x.shape)))
        out = x.clone()
        dist.all_reduce(out, group=self.group)
        return out

    def all_gather(self, out: Any, x: Any) -> None:
        import torch.distributed as dist

        self.calls.append(("all_gather", tuple(x.shape)))
        dist.all_gather(list(out.chunk(self.world_size)), x, group=self.group)


def _cuda_rank(rank: int, world: int, port: int, switch: str, queue: Any, shapes: dict[str, tuple[int, ...]]) -> None:
    os.environ["VLLM_HOST_COLLECTIVES"] = switch
    import torch
    import torch.distributed as dist
    from vllm.distributed import parallel_state
    from vllm.distributed.device_communicators import pynccl
    from vllm.distributed.device_communicators.cuda_communicator import CudaCommunicator

    pynccl.PyNcclCommunicator = _NcclStandIn
    parallel_state.set_custom_all_reduce(False)  # the rig has no P2P, so vLLM's custom all-reduce is off
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    try:
        group = dist.group.WORLD  # as GroupCoordinator builds it: no global_ranks
        comm = CudaCommunicator(cpu_group=group, device=torch.device("cpu"), device_group=group, unique_name="tp:0")
        report: dict[str, Any] = {"rank": rank, "host": type(getattr(comm, "host_comm", None)).__name__}
        for seed, name in enumerate(("decode", "prefill")):
            xs = _order_sensitive(world, shapes[name], seed)
            got = comm.all_reduce(xs[rank].clone())
            other = _in_rank_order([xs[0], xs[2], xs[1]])
            report[name] = {"dtype": str(got.dtype), "shape": tuple(got.shape),
                            "rank_order": torch.equal(got, _in_rank_order(xs)),
                            "other_order_differs": int((other != _in_rank_order(xs)).sum())}
        logits = [torch.randn(shapes["logits"], generator=torch.Generator().manual_seed(9 + r)).to(torch.bfloat16)
                  for r in range(world)]
        gathered = comm.all_gather(logits[rank], dim=-1)
        report["logits"] = {"shape": tuple(gathered.shape), "equal": torch.equal(gathered, torch.cat(logits, dim=-1))}
        report["nccl_calls"] = list(_NcclStandIn.calls)
        report["host_calls"] = getattr(getattr(getattr(comm, "host_comm", None), "_engine", None), "seq", 0)
        queue.put((rank, report))
    finally:
        dist.destroy_process_group()


def test_cuda_communicator_routes_the_rigs_collectives_through_host_memory_in_rank_order() -> None:
    """Switch on, three ranks: the decode and prefill all-reduces and the logits all-gather, at the rig's shapes
    and dtype, go through the host buffer (nothing reaches NCCL) and the sums are the float32 sums in rank order,
    bit for bit, on inputs where another order gives other bf16 results."""
    shapes = _rig_shapes()
    for rank, report in _run(_cuda_rank, "1", 3, shapes):
        assert report["host"] == "HostCollectives", f"rank {rank}: CudaCommunicator has no host collectives"
        assert report["nccl_calls"] == [], f"rank {rank}: these reached NCCL: {report['nccl_calls']}"
        assert report["host_calls"] == 3  # two all-reduces, one all-gather, each within one 64 MiB segment
        for name in ("decode", "prefill"):
            assert report[name]["shape"] == shapes[name] and report[name]["dtype"] == "torch.bfloat16"
            assert report[name]["other_order_differs"] > 0, f"{name}: the inputs do not depend on the order"
            assert report[name]["rank_order"], f"rank {rank}: {name} all-reduce is not the rank-order sum"
        assert report["logits"] == {"shape": (shapes["logits"][0], 3 * shapes["logits"][1]), "equal": True}


@pytest.mark.upstream_guard
def test_cuda_communicator_without_the_switch_takes_nccl() -> None:
    shapes = _rig_shapes()
    for rank, report in _run(_cuda_rank, "0", 3, shapes):
        assert report["host"] == "NoneType"
        assert [call for call, _ in report["nccl_calls"]] == ["all_reduce", "all_reduce", "all_gather"], rank
        assert report["logits"]["equal"]
