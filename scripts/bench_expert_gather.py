"""Benchmark: the expert-offload miss gather (patch 0013) against a contiguous pinned-host copy, on one CUDA GPU.

One MoE layer of the seed's model (GLM-5.3-Flash NVFP4: 163.3 GiB of experts over 45 layers x 288 experts, so
163.3 GiB / 12,960 = 13,529,681 bytes an expert, rounded up to 13,529,856 for 256-byte rows) lives in pinned host
memory. For 8 to 64 misses per step, everything below is captured in a CUDA graph (four steps, each on another
random set of experts, so the L2 never holds a step's bytes) and replayed, in one run:
- contiguous: a copy-engine copy of the same number of bytes from one contiguous pinned range (the denominator);
- per-expert copies: one copy-engine copy per missed expert (needs the ids on the CPU: a sync per step in a server);
- index_select on the zero-copy view of the host buffer (ids on the GPU);
- the Triton gather of patch 0013 (ids and count on the GPU), over a sweep of its tile shapes, and a TMA variant.
It prints GB/s and each one's fraction of contiguous. Torch and Triton only; the kernel module is read from the
patch stack (tests/kernels/sm8x_load.py), so no vLLM is needed.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import torch
import triton
import triton.language as tl

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests" / "kernels"))

import sm8x_load  # noqa: E402

MODULE = "vllm/model_executor/layers/fused_moe/expert_offload_kernels.py"
GIB = 1 << 30
EXPERT_BYTES_EXACT = 163.3 * GIB / (45 * 288)
EXPERT_BYTES = -(-int(EXPERT_BYTES_EXACT) // 256) * 256
N_EXPERTS = 288
STAGING = 64
STEPS = 4  # steps per graph, each on its own expert set
# (block, chunk, warps, programs per SM, stages) of the gather; the first is the module's default.
SWEEP = [(8192, 1 << 18, 8, 2, 1), (4096, 1 << 16, 4, 1, 1), (4096, 1 << 16, 4, 2, 1), (4096, 1 << 16, 4, 4, 1),
         (8192, 1 << 18, 8, 1, 1), (8192, 1 << 18, 8, 4, 1), (2048, 1 << 16, 4, 8, 1), (8192, 1 << 16, 8, 2, 1),
         (16384, 1 << 18, 16, 1, 1), (8192, 1 << 18, 8, 2, 3), (4096, 1 << 16, 4, 4, 3), (1024, 1 << 14, 4, 8, 1),
         (8192, 1 << 20, 8, 2, 1), (16384, 1 << 20, 16, 2, 1)]
TMA_ROWS = 128  # rows of 256 bytes a TMA tile (32 KiB)


@triton.jit
def _gather_tma_kernel(src_desc, dst_desc, list_ptr, count_ptr, rows, n_slots, ROWS: tl.constexpr):
    # Bulk tensor copies: 3-D descriptors [experts, rows, 64 int32]; the last tile of an expert is clipped by TMA.
    pid = tl.program_id(0)
    chunks = tl.cdiv(rows, ROWS)
    n_tiles = tl.minimum(tl.load(count_ptr), n_slots) * chunks
    for t in range(pid, n_tiles, tl.num_programs(0)):
        s = t // chunks
        r = (t % chunks) * ROWS
        e = tl.load(list_ptr + s)
        v = src_desc.load([e, r, 0])
        dst_desc.store([s, r, 0], v)


def _gbps(graph: torch.cuda.CUDAGraph, nbytes: int, reps: int) -> float:
    """Median GB/s of ``reps`` timed replays (after one warm-up replay)."""
    graph.replay()
    times = []
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    for _ in range(reps):
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    return nbytes / statistics.median(times) / 1e9


def _staged_right(dst: torch.Tensor, host: torch.Tensor, lst: torch.Tensor, n: int) -> bool:
    """The last step's first and last staged experts equal their host rows (a cheap check of the timed kernel)."""
    slots = sorted({0, n - 1})
    return torch.equal(dst[slots].cpu(), host[lst[slots].long()])


def _capture(step) -> torch.cuda.CUDAGraph:
    for i in range(STEPS):  # compile and warm outside the capture
        step(i)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for i in range(STEPS):
            step(i)
    return graph


def _tma_step(host_view: torch.Tensor, dst: torch.Tensor):
    """The TMA gather's step function, or the reason it cannot run here."""
    try:
        from triton.tools.tensor_descriptor import TensorDescriptor
    except ImportError as exc:
        return None, f"no host tensor descriptors in this Triton ({exc})"
    rows = EXPERT_BYTES // 256
    src = host_view.view(torch.int32).view(N_EXPERTS, rows, 64)
    out = dst.view(torch.int32).view(STAGING, rows, 64)
    src_desc = TensorDescriptor.from_tensor(src, [1, TMA_ROWS, 64])
    dst_desc = TensorDescriptor.from_tensor(out, [1, TMA_ROWS, 64])
    sms = torch.cuda.get_device_properties(0).multi_processor_count

    def step(lists, counts, i):
        _gather_tma_kernel[(sms * 2,)](src_desc, dst_desc, lists[i], counts[i], rows, STAGING, ROWS=TMA_ROWS,
                                       num_warps=4)
    return step, None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--misses", type=int, nargs="+", default=[8, 16, 32, 64])
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--no-sweep", action="store_true", help="time only the module's default gather shape")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("bench_expert_gather: no CUDA GPU here, nothing measured", file=sys.stderr)
        return 2
    if max(args.misses) > STAGING or STEPS * max(args.misses) > N_EXPERTS:
        print(f"bench_expert_gather: --misses must be at most {STAGING}", file=sys.stderr)
        return 2
    ko = sm8x_load.load_module(MODULE)
    print(f"device {torch.cuda.get_device_name()}, torch {torch.__version__}, triton {triton.__version__}")
    print(f"expert: 163.3 GiB / (45 x 288) = {EXPERT_BYTES_EXACT:,.0f} B = {EXPERT_BYTES_EXACT / 1e6:.2f} MB = "
          f"{EXPERT_BYTES_EXACT / (1 << 20):.2f} MiB; timed rows {EXPERT_BYTES:,} B; layer "
          f"{N_EXPERTS * EXPERT_BYTES / GIB:.2f} GiB pinned; staging {STAGING}; {STEPS} steps a graph", flush=True)
    host = torch.empty((N_EXPERTS, EXPERT_BYTES), dtype=torch.uint8, pin_memory=True)
    host.view(torch.int64).random_()
    view = ko.host_view_on_device(host)
    dst = torch.empty((STAGING, EXPERT_BYTES), dtype=torch.uint8, device="cuda")
    gen = torch.Generator().manual_seed(0)
    tma_step, tma_why = _tma_step(view, dst)
    configs = SWEEP if not args.no_sweep else SWEEP[:1]
    rows = []
    for n in args.misses:
        perm = torch.randperm(N_EXPERTS, generator=gen)[:STEPS * n].view(STEPS, n)
        # Sorted, as the remap lists them; padded with -1 to the staging size.
        lists = torch.full((STEPS, STAGING), -1, dtype=torch.int32)
        lists[:, :n] = perm.sort(dim=1).values.to(torch.int32)
        d_lists, d_counts = lists.cuda(), torch.full((STEPS, 1), n, dtype=torch.int32, device="cuda")
        d_long = [d_lists[i, :n].long() for i in range(STEPS)]
        nbytes = STEPS * n * EXPERT_BYTES
        res = {}
        res["contiguous"] = _gbps(_capture(lambda i: dst[:n].copy_(host[i * n:(i + 1) * n], non_blocking=True)),
                                  nbytes, args.reps)
        res["per-expert copies (ids on CPU)"] = _gbps(_capture(
            lambda i: [dst[s].copy_(host[e], non_blocking=True) for s, e in enumerate(lists[i, :n].tolist())]),
            nbytes, args.reps)
        res["index_select zero-copy"] = _gbps(_capture(
            lambda i: torch.index_select(view, 0, d_long[i], out=dst[:n])), nbytes, args.reps)
        for block, chunk, warps, per_sm, stages in configs:
            sms = torch.cuda.get_device_properties(0).multi_processor_count
            g = _capture(lambda i: ko.gather_misses(view, d_lists[i], d_counts[i], dst, block=block, chunk=chunk,
                                                    num_warps=warps, programs=sms * per_sm, stages=stages))
            res[f"triton b{block} c{chunk} w{warps} p{per_sm}/SM s{stages}"] = _gbps(g, nbytes, args.reps)
            if not _staged_right(dst, host, lists[STEPS - 1], n):
                raise SystemExit(f"gather b{block} c{chunk}: staging differs from the host rows (n={n})")
        if tma_step is not None:
            try:
                res["triton TMA bulk tiles"] = _gbps(_capture(lambda i: tma_step(d_lists, d_counts, i)), nbytes,
                                                     args.reps)
                if not _staged_right(dst, host, lists[STEPS - 1], n):
                    res.pop("triton TMA bulk tiles")
                    tma_why = "TMA gather copied wrong bytes"
            except Exception as exc:  # noqa: BLE001 - report why the variant cannot run, keep the rest
                tma_step, tma_why = None, f"{type(exc).__name__}: {str(exc).splitlines()[0][:160]}"
        rows.append((n, res))
        base = res["contiguous"]
        print(f"\nmisses {n} ({n * EXPERT_BYTES / 1e6:.0f} MB a step), graph-replayed:")
        for name, gbps in sorted(res.items(), key=lambda kv: -kv[1]):
            print(f"  {name:44s} {gbps:6.2f} GB/s  {gbps / base:5.3f} of contiguous")
        torch.cuda.synchronize()
        sys.stdout.flush()
    if tma_why:
        print(f"\nTMA variant not measured: {tma_why}")
    print("\nsummary (fraction of contiguous, graph-replayed): misses | contiguous GB/s | index_select | "
          "module default | best triton (shape)")
    for n, res in rows:
        tri = {k: v for k, v in res.items() if k.startswith("triton")}
        best = max(tri, key=tri.get)
        default = next(k for k in res if k.startswith("triton b"))
        print(f"  {n:3d} | {res['contiguous']:.2f} | {res['index_select zero-copy'] / res['contiguous']:.3f} | "
              f"{res[default] / res['contiguous']:.3f} | {tri[best] / res['contiguous']:.3f} ({best})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
