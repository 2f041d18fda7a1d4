"""Probe (issue 17): does a memcpy node inside a conditional graph node's body run on the copy engine or on the SMs?

One 866 MB pinned-host-to-device copy (64 experts of the seed's size), captured in a CUDA graph either as a plain
memcpy node or inside an IF node's body (cond_copy.py), is timed alone and while a Triton kernel holds every SM's
threads for a fixed time on another stream. A copy-engine copy overlaps the busy kernel; a copy done by SM kernels
waits until the SMs are free. The profiler's names of the replayed work are printed too. Needs cuda.bindings and a
GPU: python3 -m rigstack.bench.cond_copy_probe
"""

from __future__ import annotations

import sys
from collections.abc import Callable

import torch
import triton
import triton.language as tl

from rigstack.bench import cond_copy
from rigstack.bench.expert_gather import EXPERT_BYTES, STAGING


@triton.jit
def _busy_kernel(out_ptr, iters, BLOCK: tl.constexpr):
    # Arithmetic with no memory traffic, on programs that take all of an SM's threads.
    x = tl.arange(0, BLOCK).to(tl.float32)
    for _ in range(iters):
        x = x * 0.999999 + 1e-6
    tl.store(out_ptr + tl.program_id(0) * BLOCK + tl.arange(0, BLOCK), x)


def _ms(fn, stream: torch.cuda.Stream | None = None) -> float:
    """Milliseconds of the work ``fn`` queues on ``stream`` (default: the current one), by events on it."""
    stream = stream or torch.cuda.current_stream()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    start.record(stream)
    fn()
    end.record(stream)
    torch.cuda.synchronize()
    return start.elapsed_time(end)


def _graphs(host: torch.Tensor, dst: torch.Tensor) -> dict[str, torch.cuda.CUDAGraph]:
    """The copy captured both ways, each replayed once and its bytes checked."""
    first = torch.zeros(1, dtype=torch.int32, device="cuda")
    one = torch.ones(1, dtype=torch.int32, device="cuda")
    builder = cond_copy.CondGather()
    graphs = {}
    for name, step in (("plain memcpy node", lambda: dst.copy_(host, non_blocking=True)),
                       ("memcpy in an IF body", lambda: builder.gather(
                           "if", host.view(1, -1), first, one, dst.view(1, -1)))):
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            step()
        graph.replay()
        torch.cuda.synchronize()
        if not torch.equal(dst[-1, ::4099].cpu(), host[-1, ::4099]):
            raise SystemExit(f"{name}: wrong bytes")
        graphs[name] = graph
    return graphs


def _busy_kernel_for_40_ms() -> tuple[Callable[[], None], float]:
    """A launch of the busy kernel that holds every SM for about 40 ms on its own stream, and its time."""
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    block = 1024 * 4  # 32 warps x 32 threads, 4 elements each: 1024 threads a program, 2 programs an SM
    out = torch.empty(sms * 2 * block, device="cuda")
    busy_stream = torch.cuda.Stream()

    def busy(iters: int) -> None:
        with torch.cuda.stream(busy_stream):
            _busy_kernel[(sms * 2,)](out, iters, BLOCK=block, num_warps=32, maxnreg=32)
    iters = 1 << 16
    busy(iters)  # compile first (Triton specializes on the count's divisibility by 16: keep it a multiple of 16)
    busy_ms = _ms(lambda: busy(iters), busy_stream)
    iters = int(iters * 40 / busy_ms) // 16 * 16  # about 40 ms
    busy(iters)
    busy_ms = min(_ms(lambda: busy(iters), busy_stream) for _ in range(3))
    try:  # Triton's private cache layout: where it differs, say so rather than guess
        regs = next(iter(_busy_kernel.device_caches[0][0].values())).n_regs
    except (AttributeError, KeyError, IndexError, StopIteration, TypeError):
        regs = "unknown"
    print(f"busy kernel alone: {busy_ms:.1f} ms on {sms * 2} programs of 1024 threads, {regs} registers a thread")
    return lambda: busy(iters), busy_ms


def _time_beside_busy(name: str, graph: torch.cuda.CUDAGraph, busy: Callable[[], None], busy_ms: float,
                      nbytes: int) -> None:
    alone = min(_ms(graph.replay) for _ in range(3))
    both = []
    for _ in range(3):
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        busy()
        start.record()  # on the default stream, after the busy kernel was queued on its own
        graph.replay()
        end.record()
        torch.cuda.synchronize()
        both.append(start.elapsed_time(end))
    print(f"{name:22s}: alone {alone:6.1f} ms ({nbytes / alone / 1e6:5.1f} GB/s); "
          f"with every SM busy for {busy_ms:.0f} ms: {min(both):6.1f} ms")
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        graph.replay()
        torch.cuda.synchronize()
    names = sorted({e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA})
    print(f"{name:22s}: profiler saw {names[:8]}")


def main() -> int:
    why = cond_copy.unavailable()
    if why or not torch.cuda.is_available():
        print(f"cond_copy_probe: not run: {why or 'no CUDA GPU'}", file=sys.stderr)
        return 2
    host = torch.empty((STAGING, EXPERT_BYTES), dtype=torch.uint8, pin_memory=True)
    host.view(torch.int64).random_()
    dst = torch.empty_like(host, device="cuda")
    graphs = _graphs(host, dst)
    busy, busy_ms = _busy_kernel_for_40_ms()
    for name, graph in graphs.items():
        _time_beside_busy(name, graph, busy, busy_ms, dst.numel())
    return 0


if __name__ == "__main__":
    sys.exit(main())
