"""Benchmark: the SM8x sparse-MLA decode kernel (patch 0009) against plain torch, on one CUDA GPU.

GLM-5.3-Flash decode shapes: 64 heads, 512-wide latent, top-k 2048 rows of the packed fp8_ds_mla
cache (656 B each) out of a pool past 2**31 bytes. For each decode batch it prints the kernel's
median time with software FP8 decode (what an sm_80 card runs) and with hardware FP8 (sm_89+), the
plain torch implementation's time on the same GPU (gather, dequantize, bf16 einsum-softmax-einsum),
their ratio, and the kernel's achieved bandwidth: bytes it must read (batch * top-k * 656 plus q and
the output) over its time, as a fraction of the datasheet peak and of a device-to-device copy
measured in the same run. Index sets rotate so L2 never holds a whole launch's rows. The kernel
modules are taken from the patch stack (rigstack/bench/kernel_sources.py), so no vLLM is needed.
`scripts/bench_sparse_mla.py` is its command.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
import triton.testing

from rigstack.bench import kernel_sources
from rigstack.errors import UserError

ROW = 656
PEAK_TBS = 4.8  # H200 datasheet HBM3e bandwidth


def _median_ms(fn, rotations: int, rep: int = 300) -> float:
    state = {"i": 0}

    def step():
        fn(state["i"] % rotations)
        state["i"] += 1

    return triton.testing.do_bench(step, warmup=25, rep=rep, return_mode="median")


def _copy_tbs() -> float:
    src = torch.empty(2 << 30, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    ms = _median_ms(lambda _: dst.copy_(src), 1)
    return 2 * src.numel() / ms / 1e9


def _sweep(m, kv, batches: list[int], heads: int, topk: int, rotations: int) -> list:
    """Time block shapes and split counts (software FP8) to choose the kernel's defaults."""
    print("sweep (soft FP8): batch (block_h, block_n, warps, stages, splits) -> ms, best 4", flush=True)
    out = []
    shapes = [(bh, bn, w, st) for bh, w in ((16, 4), (32, 4), (32, 8), (64, 8)) for bn in (32, 64) for st in (1, 2, 3)]
    for batch in batches:
        q = torch.randn(batch, heads, 512, device="cuda").to(torch.bfloat16)
        idx = [torch.randint(0, kv.shape[0], (batch, topk), device="cuda", dtype=torch.int32) for _ in range(rotations)]
        splits_options = (4, 8, 16, 32, 64) if batch == 1 else (1, 2, 4, 8, 16) if batch <= 8 else (1, 2, 4, 8)
        timings = []
        for bh, bn, w, st in shapes:
            for sp in splits_options:
                try:
                    ms = _median_ms(lambda i, c=(bh, bn, w, st, sp): m.sparse_mla_fwd(
                        q, None, kv, idx[i], 0.05, soft_fp8=True, block_h=c[0], block_n=c[1],
                        num_warps=c[2], num_stages=c[3], num_splits=c[4]), rotations, rep=60)
                except Exception as error:  # noqa: BLE001 - a shape that does not fit is reported, not fatal
                    print(f"  {batch} {(bh, bn, w, st, sp)}: {type(error).__name__}", flush=True)
                    continue
                timings.append(((bh, bn, w, st, sp), ms))
        timings.sort(key=lambda t: t[1])
        for cfg, ms in timings[:4]:
            print(f"  {batch:>3} {cfg}: {ms:.4f} ms", flush=True)
        out.append({"batch": batch, "timings": [[list(c), ms] for c, ms in timings]})
    return out


def _indexer(copy: float) -> dict:
    """Paged indexer logits at a 1M-token context (262144 pools of 4) for 16 requests."""
    ix = kernel_sources.load().triton_indexer_sm8x
    batch, heads, dim, page, ctx = 16, 32, 128, 64, 262_144
    pages = batch * ctx // page
    cache = torch.randint(0, 120, (pages, page * (dim + 4)), dtype=torch.uint8, device="cuda")
    cache[:, page * dim :] = torch.rand(pages, page, device="cuda").view(torch.uint8)
    cache = cache.view(pages, page, 1, dim + 4)
    q = torch.randint(0, 120, (batch, 1, heads, dim), dtype=torch.uint8, device="cuda").view(torch.float8_e4m3fn)
    w = torch.randn(batch, heads, device="cuda")
    lens = torch.full((batch,), ctx, dtype=torch.int32, device="cuda")
    bt = torch.randperm(pages, device="cuda").view(batch, -1).int()
    nbytes = batch * ctx * (dim + 4) + batch * ctx * 4  # keys + scales read, logits written
    row = {}
    for soft in (True, False):
        for block_n in (64, 128):
            ms = _median_ms(lambda _: ix.paged_mqa_logits(q, cache, w, lens, bt, ctx, soft_fp8=soft,
                                                           block_n=block_n), 1)
            row[f"{'soft' if soft else 'hw'}_ms_block{block_n}"] = ms
            print(f"indexer paged logits, 16 x 262144 pools, soft={soft}, block_n={block_n}: {ms:.3f} ms, "
                  f"{nbytes / ms / 1e9:.2f} TB/s ({nbytes / ms / 1e9 / copy:.1%} of copy)", flush=True)
    return row


def run_bench(batches: list[int], heads: int, topk: int, pool_rows: int, sweep: bool, indexer: bool,
              json_out: Path | None) -> int:
    if not torch.cuda.is_available():
        raise UserError("bench_sparse_mla needs a CUDA GPU: run it on the GPU machine")
    m = kernel_sources.load().triton_sparse_mla_sm8x
    torch.manual_seed(0)
    kv = torch.empty(pool_rows, ROW, dtype=torch.uint8, device="cuda")
    for start in range(0, pool_rows, 1 << 20):
        n = min(1 << 20, pool_rows - start)
        kv[start : start + n] = m.pack_fp8_ds_mla_torch(torch.randn(n, 512, device="cuda"), None)
    copy = _copy_tbs()
    scale = 576**-0.5
    rotations = 8
    results = []
    print(f"{torch.cuda.get_device_name()}, pool {pool_rows} rows = {pool_rows * ROW / 2**30:.2f} GiB, "
          f"heads {heads}, top-k {topk}, D2D copy {copy:.2f} TB/s", flush=True)
    header = (f"{'batch':>5} {'soft ms':>8} {'hw ms':>8} {'torch ms':>9} {'torch/soft':>10} "
              f"{'soft TB/s':>9} {'of peak':>7} {'of copy':>7} {'TFLOP/s':>7}")
    print(header, flush=True)
    for batch in batches:
        q = torch.randn(batch, heads, 512, device="cuda").to(torch.bfloat16)
        idx = [torch.randint(0, pool_rows, (batch, topk), device="cuda", dtype=torch.int32) for _ in range(rotations)]
        soft = _median_ms(lambda i: m.sparse_mla_fwd(q, None, kv, idx[i], scale, soft_fp8=True), rotations)
        hw = _median_ms(lambda i: m.sparse_mla_fwd(q, None, kv, idx[i], scale, soft_fp8=False), rotations)
        ref = _median_ms(lambda i: m.sparse_mla_torch(q, None, kv, idx[i], scale, torch.bfloat16), rotations)
        nbytes = batch * topk * (ROW + 4) + 2 * q.numel() * 2
        tbs = nbytes / soft / 1e9
        tflops = 4 * batch * heads * topk * 512 / soft / 1e9  # QK and PV, 2 flops per multiply-add
        row = {"batch": batch, "soft_ms": soft, "hw_ms": hw, "torch_ms": ref, "speedup": ref / soft,
               "soft_tbs": tbs, "of_peak": tbs / PEAK_TBS, "of_copy": tbs / copy, "tflops": tflops}
        results.append(row)
        print(f"{batch:>5} {soft:>8.4f} {hw:>8.4f} {ref:>9.4f} {ref / soft:>10.1f} {tbs:>9.2f} "
              f"{tbs / PEAK_TBS:>7.1%} {tbs / copy:>7.1%} {tflops:>7.1f}", flush=True)
    if sweep:
        results.append({"sweep": _sweep(m, kv, batches, heads, topk, rotations)})
    if indexer:
        results.append({"indexer": _indexer(copy)})
    if json_out is not None:
        json_out.write_text(json.dumps({"copy_tbs": copy, "results": results}, indent=1))
    return 0
