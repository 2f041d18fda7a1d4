"""Benchmark: the expert-offload miss gather (patch 0013) against a contiguous pinned-host copy, on one CUDA GPU.

One MoE layer of the seed's model (GLM-5.3-Flash NVFP4: 163.3 GiB of experts over 45 layers x 288 experts, so
163.3 GiB / 12,960 = 13,529,681 bytes an expert, rounded up to 13,529,856 for 256-byte rows) lives in pinned host
memory. For 8 to 64 misses per step, everything below is captured in a CUDA graph (four steps, each on another
random set of experts, so the L2 never holds a step's bytes) and replayed, in one run:
- contiguous: a copy-engine copy of the same number of bytes from one contiguous pinned range (the denominator);
- per-expert copies: one copy-engine copy per missed expert (needs the ids on the CPU: a sync per step in a server);
- index_select on the zero-copy view of the host buffer (ids on the GPU);
- the Triton gather of patch 0013 (ids and count on the GPU), over a sweep of its tile shapes, a TMA variant,
  one whose loads carry the L2::256B prefetch-size hint, and ones whose programs bulk-prefetch their next tile into
  L2 through the TMA unit (cp.async.bulk.prefetch.L2) while copying the current one;
- the ceiling of SM reads: the same Triton kernel over one flat contiguous range of the same bytes;
- copy-engine gathers chosen on the GPU by CUDA graph conditional nodes (cond_copy.py, where cuda.bindings is
  installed): a SWITCH per staging slot, or an IF per expert into a landing slot per expert, in parallel chains;
  these read the list and count from the device, so one graph serves every miss count, and a count of 0 gives
  their cost when nothing is copied.
It prints GB/s and each one's fraction of contiguous. Torch and Triton only; the kernel module is read from the
patch stack (tests/kernels/kernel_sources.py), so no vLLM is needed. `scripts/bench_expert_gather.py` is its command.
"""

from __future__ import annotations

import statistics
import sys
import time
from dataclasses import dataclass
from types import ModuleType

import torch
import triton
import triton.language as tl

from rigstack.bench import cond_copy
from rigstack.bench import kernel_sources
from rigstack.bench.graph_timing import replay_gbps, replay_seconds

MODULE = "vllm/model_executor/layers/fused_moe/expert_offload_kernels.py"
GIB = 1 << 30
EXPERT_BYTES_EXACT = 163.3 * GIB / (45 * 288)
EXPERT_BYTES = -(-int(EXPERT_BYTES_EXACT) // 256) * 256
N_EXPERTS = 288
STAGING = 64
STEPS = 4  # steps per graph, each on its own expert set
# (block, chunk, warps, programs per SM, stages) of the gather; the first is the module's default.
# A first run of 14 shapes (1-16 KiB..64 KiB a load step, 64 KiB..4 MiB tiles, 1-8 programs an SM, 1 or 3 stages)
# spread only 0.924-0.928; these span it.
SWEEP = [(8192, 1 << 18, 8, 2, 1), (1024, 1 << 14, 4, 8, 1), (4096, 1 << 16, 4, 4, 3), (16384, 1 << 20, 16, 2, 1)]
TMA_ROWS = 128  # rows of 256 bytes a TMA tile (32 KiB)
# Conditional-node gathers (layout, parallel chains); SWITCH costs STAGING x N_EXPERTS memcpy nodes a step.
CONDITIONAL = [("switch", 1), ("switch", 4), ("if", 1), ("if", 2), ("if", 4), ("if", 16), ("if", N_EXPERTS)]


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


@triton.jit
def _gather_l2hint_kernel(src_ptr, dst_ptr, list_ptr, count_ptr, row_elems, n_slots, CHUNK: tl.constexpr,
                          VECS: tl.constexpr):
    # The module's persistent tiles, but 16-byte loads in inline PTX with the L2::256B prefetch-size hint, to ask
    # the memory system for 256-byte reads of host memory instead of 128-byte lines.
    pid = tl.program_id(0)
    chunks = tl.cdiv(row_elems, CHUNK)
    n_tiles = tl.minimum(tl.load(count_ptr), n_slots) * chunks
    for t in range(pid, n_tiles, tl.num_programs(0)):
        s = t // chunks
        base = (t % chunks).to(tl.int64) * CHUNK
        src = src_ptr + tl.load(list_ptr + s).to(tl.int64) * row_elems + base
        dst = dst_ptr + s.to(tl.int64) * row_elems + base
        for off in range(0, CHUNK, VECS * 4):
            v = off + tl.arange(0, VECS) * 4
            m = base + v < row_elems
            a, b, c, d = tl.inline_asm_elementwise(
                "{ .reg .pred p; setp.ne.b32 p, $5, 0; @p ld.global.nc.L2::256B.v4.u32 {$0, $1, $2, $3}, [$4]; }",
                "=r,=r,=r,=r,l,r", [src + v, m.to(tl.int32)], dtype=(tl.int32, tl.int32, tl.int32, tl.int32),
                is_pure=True, pack=1)
            tl.store(dst + v, a, mask=m)
            tl.store(dst + v + 1, b, mask=m)
            tl.store(dst + v + 2, c, mask=m)
            tl.store(dst + v + 3, d, mask=m)


@triton.jit
def _bulk_prefetch(src_ptr, list_ptr, t, chunks, row_elems, CHUNK: tl.constexpr):
    # One thread asks the TMA unit to pull tile t's bytes into L2 (cp.async.bulk.prefetch.L2): a bulk read of host
    # memory, which might travel in larger PCIe reads than the SMs' 128-byte lines.
    base = (t % chunks).to(tl.int64) * CHUNK
    src = src_ptr + tl.load(list_ptr + t // chunks).to(tl.int64) * row_elems + base
    nbytes = (tl.minimum(row_elems - base, CHUNK) * 4).to(tl.int32)
    tl.inline_asm_elementwise(
        "{ .reg .pred p; .reg .u32 i; mov.u32 i, %tid.x; setp.eq.u32 p, i, 0; "
        "@p cp.async.bulk.prefetch.L2.global [$1], $2; mov.u32 $0, 0; }",
        "=r,l,r", [src + tl.zeros([1], tl.int64), tl.zeros([1], tl.int32) + nbytes], dtype=tl.int32,
        is_pure=False, pack=1)


@triton.jit
def _gather_prefetch_kernel(src_ptr, dst_ptr, list_ptr, count_ptr, row_elems, n_slots, CHUNK: tl.constexpr,
                            BLOCK: tl.constexpr):
    # The module's persistent tiles, each program prefetching its next tile into L2 while it copies this one.
    pid = tl.program_id(0)
    n_prog = tl.num_programs(0)
    chunks = tl.cdiv(row_elems, CHUNK)
    n_tiles = tl.minimum(tl.load(count_ptr), n_slots) * chunks
    if pid < n_tiles:
        _bulk_prefetch(src_ptr, list_ptr, pid, chunks, row_elems, CHUNK)
    for t in range(pid, n_tiles, n_prog):
        if t + n_prog < n_tiles:
            _bulk_prefetch(src_ptr, list_ptr, t + n_prog, chunks, row_elems, CHUNK)
        s = t // chunks
        base = (t % chunks).to(tl.int64) * CHUNK
        src = src_ptr + tl.load(list_ptr + s).to(tl.int64) * row_elems + base
        dst = dst_ptr + s.to(tl.int64) * row_elems + base
        for off in range(0, CHUNK, BLOCK):
            idx = off + tl.arange(0, BLOCK)
            m = base + idx < row_elems
            tl.store(dst + idx, tl.load(src + idx, mask=m, cache_modifier=".cg"), mask=m, cache_modifier=".cs")


def _staged_right(dst: torch.Tensor, host: torch.Tensor, lst: torch.Tensor, n: int) -> bool:
    """The last step's first and last staged experts equal their host rows (a cheap check of the timed kernel)."""
    slots = sorted({0, n - 1})
    return torch.equal(dst[slots].cpu(), host[lst[slots].long()])


def _capture(step, warm: bool = True) -> torch.cuda.CUDAGraph:
    for i in range(STEPS if warm else 0):  # compile and warm outside the capture
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


def _steps(ko, host: torch.Tensor, view: torch.Tensor, dst: torch.Tensor, lists: torch.Tensor,
           d_lists: torch.Tensor, d_counts: torch.Tensor, n: int, sweep: list[tuple[int, int, int, int, int]]) -> dict:
    """Name -> step function (step i copies step i's experts) of every way to stage ``n`` misses."""
    d_long = [d_lists[i, :n].long() for i in range(STEPS)]
    first = torch.zeros(1, dtype=torch.int32, device="cuda")
    one = torch.ones(1, dtype=torch.int32, device="cuda")
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    s_rows, d_rows = view.view(torch.int32), dst.view(torch.int32)
    steps = {
        "contiguous": lambda i: dst[:n].copy_(host[i * n:(i + 1) * n], non_blocking=True),
        "per-expert copies (ids on CPU)": lambda i: [dst[s].copy_(host[e], non_blocking=True)
                                                     for s, e in enumerate(lists[i, :n].tolist())],
        "index_select zero-copy": lambda i: torch.index_select(view, 0, d_long[i], out=dst[:n]),
        # The SM-read ceiling: the module's kernel over one contiguous range of the same bytes (no gather at all).
        "SM ceiling: triton over one contiguous range": lambda i: ko.gather_misses(
            view[i * n:(i + 1) * n].reshape(1, -1), first, one, dst[:n].reshape(1, -1)),
        "triton L2::256B-hint loads (PTX)": lambda i: _gather_l2hint_kernel[(sms * 2,)](
            s_rows, d_rows, d_lists[i], d_counts[i], s_rows.shape[1], STAGING, CHUNK=1 << 18, VECS=2048,
            num_warps=8),
    }
    for chunk in (1 << 14, 1 << 15):  # 64 and 128 KiB tiles: 2 programs an SM keep 17-34 MB of L2 in flight
        steps[f"triton bulk-prefetch-L2 c{chunk}"] = lambda i, c=chunk: _gather_prefetch_kernel[(sms * 2,)](
            s_rows, d_rows, d_lists[i], d_counts[i], s_rows.shape[1], STAGING, CHUNK=c, BLOCK=4096, num_warps=8)
    for block, chunk, warps, per_sm, stages in sweep:
        steps[f"triton b{block} c{chunk} w{warps} p{per_sm}/SM s{stages}"] = (
            lambda i, b=block, c=chunk, w=warps, ps=per_sm, st=stages: ko.gather_misses(
                view, d_lists[i], d_counts[i], dst, block=b, chunk=c, num_warps=w, programs=sms * ps, stages=st))
    tma, why = _tma_step(view, dst)
    if tma is not None:
        steps["triton TMA bulk tiles"] = lambda i: tma(d_lists, d_counts, i)
    else:
        print(f"TMA variant not measured: {why}")
    return steps


def _graphs(steps: dict, host: torch.Tensor, dst: torch.Tensor, lists: torch.Tensor, n: int) -> dict:
    """Name -> captured graph, for the variants that run here and stage the right bytes."""
    graphs = {}
    for name, step in steps.items():
        try:
            graph = _capture(step)
        except Exception as exc:  # noqa: BLE001 - say why a variant cannot run, keep the others
            print(f"{name}: not measured: {type(exc).__name__}: {str(exc).splitlines()[0][:160]}")
            continue
        # The contiguous copies stage the last step's block of experts; the others its listed ones.
        want = torch.arange((STEPS - 1) * n, STEPS * n, dtype=torch.int32) if "contiguous" in name else lists[-1]
        if not _staged_right(dst, host, want, n):
            raise SystemExit(f"{name}: staging differs from the host rows (misses {n})")
        graphs[name] = graph
    return graphs


def _conditional(host: torch.Tensor, dst: torch.Tensor, land: torch.Tensor, d_lists: torch.Tensor,
                 d_counts: torch.Tensor) -> tuple[cond_copy.CondGather | None, dict]:
    """The builder and name -> (layout, graph) of the conditional-node gathers, or (None, {}) with the reason printed;
    captured once, they read the lists and counts from the device at every replay."""
    why = cond_copy.unavailable()
    try:
        builder = None if why else cond_copy.CondGather()
    except Exception as exc:  # noqa: BLE001 - say why the variants cannot run, keep the others
        why = f"{type(exc).__name__}: {str(exc).splitlines()[0][:160]}"
    if why:
        print(f"conditional-node gathers not measured: {why}")
        return None, {}
    graphs = {}
    for mode, chains in CONDITIONAL:
        name = (f"CE SWITCH per slot, {chains} chain(s)" if mode == "switch" else
                f"CE IF per expert, {chains} chain(s), landing[e]")
        before = builder.memcpy_nodes, builder.cond_nodes
        t0 = time.perf_counter()
        try:
            graph = _capture(lambda i, m=mode, c=chains: builder.gather(
                m, host, d_lists[i], d_counts[i], dst if m == "switch" else land, chains=c), warm=False)
            graph.replay()
            torch.cuda.synchronize()
        except Exception as exc:  # noqa: BLE001
            print(f"{name}: not measured: {type(exc).__name__}: {str(exc).splitlines()[0][:160]}")
            continue
        print(f"{name}: {builder.cond_nodes - before[1]} conditional and {builder.memcpy_nodes - before[0]} memcpy "
              f"nodes in {STEPS} steps, captured and instantiated in {time.perf_counter() - t0:.1f} s", flush=True)
        graphs[name] = (mode, graph)
    return builder, graphs


@dataclass
class _Rig:
    """The buffers every miss count reuses: the pinned layer, its zero-copy view, the staging (and, for the IF
    layout, landing) rows, the device-side step lists and counts, and the conditional-node gathers."""

    ko: ModuleType
    host: torch.Tensor
    view: torch.Tensor
    dst: torch.Tensor
    d_lists: torch.Tensor
    d_counts: torch.Tensor
    land: torch.Tensor | None
    builder: cond_copy.CondGather | None
    cond: dict


def _rig(conditional: bool) -> _Rig:
    ko = kernel_sources.load_module(MODULE)
    host = torch.empty((N_EXPERTS, EXPERT_BYTES), dtype=torch.uint8, pin_memory=True)
    host.view(torch.int64).random_()
    dst = torch.empty((STAGING, EXPERT_BYTES), dtype=torch.uint8, device="cuda")
    # The step lists and counts stay in these buffers, refilled for each miss count.
    d_lists = torch.full((STEPS, STAGING), -1, dtype=torch.int32, device="cuda")
    d_counts = torch.zeros((STEPS, 1), dtype=torch.int32, device="cuda")
    # The IF layout lands each expert in its own row.
    land = torch.empty((N_EXPERTS, EXPERT_BYTES), dtype=torch.uint8, device="cuda") if conditional else None
    builder, cond = _conditional(host, dst, land, d_lists, d_counts) if conditional else (None, {})
    return _Rig(ko, host, ko.host_view_on_device(host), dst, d_lists, d_counts, land, builder, cond)


def _graphs_for(rig: _Rig, n: int, lists: torch.Tensor, sweep: bool) -> dict:
    """Every variant captured for n misses a step, each checked to stage the listed experts' rows."""
    rig.d_lists.copy_(lists)
    rig.d_counts.fill_(n)
    host, dst = rig.host, rig.dst
    graphs = _graphs(_steps(rig.ko, host, rig.view, dst, lists, rig.d_lists, rig.d_counts, n,
                            SWEEP if sweep else SWEEP[:1]), host, dst, lists, n)
    if rig.cond:
        # Diagnostic: the whole step's block as ONE memcpy in one IF body; against "contiguous", this says whether
        # a conditional body's copy itself runs at the copy engine's speed (the rest is per-node cost).
        first = torch.zeros(1, dtype=torch.int32, device="cuda")
        one = torch.ones(1, dtype=torch.int32, device="cuda")
        block = _capture(lambda i: rig.builder.gather(
            "if", host[i * n:(i + 1) * n].reshape(1, -1), first, one, dst[:n].reshape(1, -1)), warm=False)
        block.replay()
        if not _staged_right(dst, host, torch.arange((STEPS - 1) * n, STEPS * n, dtype=torch.int32), n):
            raise SystemExit(f"one IF, one contiguous memcpy: staging differs from the host rows (misses {n})")
        graphs["CE one IF, one contiguous memcpy"] = block
    for name, (mode, graph) in rig.cond.items():
        graph.replay()
        if not _staged_right(dst if mode == "switch" else rig.land[lists[-1, :n].long()], host,
                             lists[-1] if mode == "switch" else lists[-1, :n], n):
            raise SystemExit(f"{name}: staging differs from the host rows (misses {n})")
        graphs[name] = graph
    return graphs


def _timed(graphs: dict, cond: dict, n: int, reps: int, rounds: int) -> str:
    """Each variant's GB/s and fraction of contiguous, printed; the summary line for n misses."""
    nbytes = STEPS * n * EXPERT_BYTES
    # Rounds, each timing every variant in turn, so a drift of the link shows in both sides of a ratio.
    speed = {name: [] for name in graphs}
    for _ in range(rounds):
        for name, graph in graphs.items():
            speed[name].append(replay_gbps(graph, nbytes, reps))
    ratio = {name: [v / c for v, c in zip(vals, speed["contiguous"])] for name, vals in speed.items()}
    print(f"\nmisses {n} ({n * EXPERT_BYTES / 1e6:.0f} MB a step), graph-replayed: median GB/s, "
          "median (min-max) of the per-round fraction of contiguous")
    for name in sorted(graphs, key=lambda k: -statistics.median(ratio[k])):
        r = ratio[name]
        print(f"  {name:44s} {statistics.median(speed[name]):6.2f} GB/s  {statistics.median(r):5.3f} "
              f"({min(r):.3f}-{max(r):.3f})")
    med = {k: statistics.median(v) for k, v in ratio.items()}
    tri = {k: v for k, v in med.items() if k.startswith("triton")}
    best = max(tri, key=tri.get)
    default = next(k for k in graphs if k.startswith("triton b"))
    ce = {k: v for k, v in med.items() if k in cond}
    best_ce = f"{max(ce.values()):.3f} ({max(ce, key=ce.get)})" if ce else "not measured"
    return (f"  {n:3d} | {statistics.median(speed['contiguous']):.2f} | "
            f"{med['per-expert copies (ids on CPU)']:.3f} | {med['index_select zero-copy']:.3f} | "
            f"{med['SM ceiling: triton over one contiguous range']:.3f} | {tri[default]:.3f} | "
            f"{tri[best]:.3f} ({best}) | {best_ce}")


def _idle_conditionals(rig: _Rig, reps: int, rounds: int) -> None:
    """A count of 0: every conditional node is evaluated and none copies; the destinations must stay untouched."""
    rig.d_counts.fill_(0)
    rig.dst.fill_(0)
    rig.land.fill_(0)
    print("\nconditional nodes with nothing to copy (count 0), median of a round of replays:")
    for name, (_, graph) in rig.cond.items():
        step_us = replay_seconds(graph, reps * rounds) / STEPS * 1e6
        if bool(rig.dst.any()) or bool(rig.land.any()):
            raise SystemExit(f"{name}: wrote with a count of 0")
        print(f"  {name:44s} {step_us:8.1f} us a step")


def run(misses: list[int], reps: int, rounds: int, sweep: bool, conditional: bool = True) -> int:
    """Time every variant for each miss count; 2 when nothing can be measured here."""
    if not torch.cuda.is_available():
        print("bench_expert_gather: no CUDA GPU here, nothing measured", file=sys.stderr)
        return 2
    if max(misses) > STAGING or min(misses) < 1:
        print(f"bench_expert_gather: --misses must be between 1 and {STAGING}", file=sys.stderr)
        return 2
    print(f"device {torch.cuda.get_device_name()}, torch {torch.__version__}, triton {triton.__version__}")
    print(f"expert: 163.3 GiB / (45 x 288) = {EXPERT_BYTES_EXACT:,.0f} B = {EXPERT_BYTES_EXACT / 1e6:.2f} MB = "
          f"{EXPERT_BYTES_EXACT / (1 << 20):.2f} MiB; timed rows {EXPERT_BYTES:,} B; layer "
          f"{N_EXPERTS * EXPERT_BYTES / GIB:.2f} GiB pinned; staging {STAGING}; {STEPS} steps a graph; "
          f"{rounds} rounds x {reps} replays, variants interleaved", flush=True)
    rig = _rig(conditional)
    gen = torch.Generator().manual_seed(0)
    summary = []
    for n in misses:
        perm = torch.randperm(N_EXPERTS, generator=gen)[:STEPS * n].view(STEPS, n)
        # Sorted, as the remap lists them; padded with -1 to the staging size.
        lists = torch.full((STEPS, STAGING), -1, dtype=torch.int32)
        lists[:, :n] = perm.sort(dim=1).values.to(torch.int32)
        graphs = _graphs_for(rig, n, lists, sweep)
        summary.append(_timed(graphs, rig.cond, n, reps, rounds))
        del graphs
        sys.stdout.flush()
    if rig.cond:
        _idle_conditionals(rig, reps, rounds)
    print("\nsummary (median fraction of contiguous, graph-replayed): misses | contiguous GB/s | per-expert copies "
          "(ids on CPU) | index_select | SM ceiling (one contiguous range) | module default | best triton (variant) "
          "| best copy-engine conditional (variant)")
    print("\n".join(summary))
    return 0
