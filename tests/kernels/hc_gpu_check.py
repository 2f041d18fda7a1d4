"""Patch 0011 on one GPU: W ranks as separate processes on cuda:0, each with its own CUDA context.

Correctness against the same rank-order sums done on the device (eager, and a captured graph replayed 1,000 times),
the INT8 bound, the copy throughput into the registered shared buffer as a fraction of a plain pinned copy measured
in the same run, and the time per call. The ranks share one GPU's copy engines and time-slice on it, so the times are
a correctness and overhead figure, not a rig's speed. Needs only torch and triton:

    python3 tests/kernels/hc_gpu_check.py [WORLD ...]     # one JSON line per rank
"""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import sys
import time

import torch

import importlib

SIZES = [1, 7, 1000, 4096, 65537, 1 << 20, 3_000_001]
CAP = 32 << 20


def _module(name: str):
    return importlib.import_module(name)


def inputs(world: int, n: int, seed: int, dtype: torch.dtype) -> list[torch.Tensor]:
    g = torch.Generator(device="cuda").manual_seed(seed)
    return [torch.randn(n, generator=g, device="cuda").to(dtype) for _ in range(world)]


def copy_fraction(comm, nbytes: int) -> dict:
    dev = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    pinned = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
    shm = comm._slots[comm.rank, :nbytes]
    out = {}
    for name, host in (("pinned", pinned), ("shm", shm)):
        for direction in ("d2h", "h2d"):
            times = []
            for _ in range(10):
                start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                (host.copy_(dev, non_blocking=True) if direction == "d2h" else dev.copy_(host, non_blocking=True))
                stop.record()
                stop.synchronize()
                times.append(start.elapsed_time(stop) / 1e3)
            out[f"{name}_{direction}_GBps"] = nbytes / sorted(times)[len(times) // 2] / 1e9
    for direction in ("d2h", "h2d"):
        out[f"fraction_{direction}"] = out[f"shm_{direction}_GBps"] / out[f"pinned_{direction}_GBps"]
    return out


def rank_main(module: str, rank: int, world: int, name: str, barrier, queue) -> None:
    hc = _module(module)

    def reference(xs: list[torch.Tensor]) -> torch.Tensor:
        return hc._sum_in_rank_order(torch.stack(xs)).to(xs[0].dtype)

    torch.cuda.set_device(0)
    comm = hc.HostCollectives(rank, world, name, "cuda:0", create=False, capacity_bytes=CAP, chunk_bytes=1 << 20,
                           int8_threshold_bytes=1 << 20, timeout_s=60)
    report: dict = {"rank": rank, "world": world, "eager_mismatch": [], "int8": []}
    for dtype in (torch.float32, torch.bfloat16):
        for i, n in enumerate(SIZES):
            xs = inputs(world, n, 100 * i, dtype)
            got = comm.all_reduce(xs[rank].clone())
            ag = comm.all_gather(xs[rank].view(n, 1), dim=0)
            torch.cuda.synchronize()
            if xs[rank].nbytes >= (1 << 20):  # INT8 path: bound sum_r absmax_r(block) / 254 (+ output rounding)
                ref = hc._sum_in_rank_order(torch.stack(xs))
                pad = (-n) % hc.INT8_BLOCK
                amax = torch.stack([torch.nn.functional.pad(x.float().abs(), (0, pad)).view(-1, hc.INT8_BLOCK).amax(1)
                                    for x in xs]).sum(0).repeat_interleave(hc.INT8_BLOCK)[:n] / 254
                slack = ref.abs() * (2 ** -7 if dtype == torch.bfloat16 else 2 ** -23) + amax
                report["int8"].append({"n": n, "dtype": str(dtype), "max_err": float((got.float() - ref).abs().max()),
                                       "within_bound": bool(((got.float() - ref).abs() <= slack).all())})
            elif not torch.equal(got, reference(xs)):
                report["eager_mismatch"].append((n, str(dtype)))
            if not torch.equal(ag.view(-1), torch.cat(xs)):
                report["eager_mismatch"].append(("all_gather", n, str(dtype)))
    comm.check()

    # A captured step: an all-reduce of a decode-sized tensor and an all-gather, replayed 1,000 times.
    static = torch.zeros(8192, dtype=torch.bfloat16, device="cuda")
    warm = torch.cuda.Stream()
    warm.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(warm):
        comm.all_reduce(static)
        comm.all_gather(static, dim=0)
    torch.cuda.current_stream().wait_stream(warm)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        red = comm.all_reduce(static)
        gat = comm.all_gather(static, dim=0)
    bad = 0
    for step in range(1000):
        xs = inputs(world, static.numel(), 10_000 + step, torch.bfloat16)
        static.copy_(xs[rank])
        graph.replay()
        if not (torch.equal(red, reference(xs)) and torch.equal(gat, torch.cat(xs))):
            bad += 1
    torch.cuda.synchronize()
    report["graph_replays"] = 1000
    report["graph_mismatch"] = bad
    comm.check()
    barrier.wait()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(200):
        graph.replay()
    torch.cuda.synchronize()
    report["graph_replay_ms"] = (time.perf_counter() - t0) / 200 * 1e3

    # Overhead per call (eager), 16 KB and 16 MB bf16 all-reduce.
    for nbytes in (16 << 10, 16 << 20):
        x = torch.randn(nbytes // 2, device="cuda").to(torch.bfloat16)
        barrier.wait()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(50):
            comm.all_reduce(x)
        torch.cuda.synchronize()
        report[f"allreduce_{nbytes >> 10}KB_ms"] = (time.perf_counter() - t0) / 50 * 1e3
    # Registered with CUDA in this process (cudaHostRegister), so its copies are DMA on the copy engines: what the
    # copy throughput below shows on an idle GPU, asked of the driver here (a timing is not a test).
    report["slots_registered"] = comm._slots.is_pinned()
    barrier.wait()
    if rank == 0:
        report["copy"] = copy_fraction(comm, CAP)
    barrier.wait()
    comm.close()
    queue.put(report)


def run(module: str, world: int) -> list[dict]:
    """Every rank's report, rank order."""
    hc = _module(module)
    name = f"rigstack-hcgpu-{os.getpid()}-{world}"
    creator = hc.HostCollectives(0, world, name, "cpu", create=True, capacity_bytes=CAP, chunk_bytes=1 << 20,
                                 int8_threshold_bytes=1 << 20)
    try:
        ctx = mp.get_context("spawn")
        barrier, queue = ctx.Barrier(world), ctx.Queue()
        procs = [ctx.Process(target=rank_main, args=(module, r, world, name, barrier, queue)) for r in range(world)]
        for p in procs:
            p.start()
        reports = [queue.get(timeout=600) for _ in procs]
        for p in procs:
            p.join()
    finally:
        creator.close(unlink=True)
    return sorted(reports, key=lambda r: r["rank"])


def main() -> int:
    from rigstack.bench import kernel_sources

    module = kernel_sources.load_host_collectives().host_collectives.__name__
    for world in [int(w) for w in (sys.argv[1:] or ["2", "4"])]:
        for report in run(module, world):
            print(json.dumps(report), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
