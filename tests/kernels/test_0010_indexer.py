"""Patch 0010: the glm5next indexer logits without DeepGEMM.

CPU tests (CI): the Triton kernels (in Triton's interpreter) against the module's torch references,
and those references against vLLM's own fp8_mqa_logits_torch / fp8_paged_mqa_logits_torch. GPU
tests (marker gpu): GLM-5.3-Flash indexer shapes (32 heads after padding, head dim 128, pools of 4
tokens, 1M-token contexts = 256K pools, a key pool past 2**31 bytes).

Error bound, stated: FP8 values are exact in bf16 and the dots accumulate in float32, so
max |logits - ref| <= 1e-3 * max |ref| on finite entries, and -inf exactly where the reference has it.
"""

from __future__ import annotations

import pytest
import torch

TOL = 1e-3
D = 128

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def fp8(shape, gen, device, scale=3.0):
    return (torch.randn(*shape, generator=gen, device=device) * scale).to(torch.float8_e4m3fn)


def paged_cache(num_blocks, block_size, gen, device):
    """Indexer K pages as the kpool writer lays them out: block_size * 128 fp8 bytes, then
    block_size float32 scales."""
    keys = fp8((num_blocks, block_size * D), gen, device).view(torch.uint8)
    scales = torch.rand(num_blocks, block_size, generator=gen, device=device).view(torch.uint8)
    return torch.cat([keys, scales], 1).view(num_blocks, block_size, 1, D + 4)


def assert_logits_close(got, ref):
    inf = torch.isinf(ref)
    assert torch.equal(torch.isinf(got), inf) and torch.equal(got[inf], ref[inf])
    scale = ref[~inf].abs().max().clamp_min(1e-6)
    err = (got[~inf] - ref[~inf]).abs().max()
    assert err <= TOL * scale, f"max abs err {err:.3e} > {TOL} * {scale:.3e}"
    return float(err), float(scale)


def prefill_case(rows, heads, keys, device="cpu", seed=0):
    gen = torch.Generator(device=device).manual_seed(seed)
    q = fp8((rows, heads, D), gen, device)
    k = fp8((keys, D), gen, device)
    k_scale = torch.rand(keys, 1, generator=gen, device=device)
    w = torch.randn(rows, heads, generator=gen, device=device)
    ks = torch.randint(0, keys // 2, (rows,), generator=gen, device=device, dtype=torch.int32)
    ke = (ks + torch.randint(0, keys // 2, (rows,), generator=gen, device=device, dtype=torch.int32)).clamp(max=keys)
    ke[0] = ks[0]  # an empty row
    return q, k, k_scale, w, ks, ke


def paged_case(batch, next_n, heads, block_size, num_blocks, ctx_max, device="cpu", seed=0):
    gen = torch.Generator(device=device).manual_seed(seed)
    q = fp8((batch, next_n, heads, D), gen, device)
    cache = paged_cache(num_blocks, block_size, gen, device)
    w = torch.randn(batch * next_n, heads, generator=gen, device=device)
    ctx = torch.randint(next_n, ctx_max + 1, (batch,), generator=gen, device=device, dtype=torch.int32)
    per_req = -(-ctx_max // block_size)
    bt = torch.randperm(num_blocks, generator=gen, device=device)[: batch * per_req].view(batch, per_req).int()
    return q, cache, w, ctx, bt


def test_prefill_logits_kernel_matches_reference_in_interpreter(interp):
    m = interp.triton_indexer_sm8x
    q, k, k_scale, w, ks, ke = prefill_case(6, 32, 150)
    got = m.mqa_logits(q, k, k_scale, w, ks, ke, soft_fp8=True)
    assert_logits_close(got, m.mqa_logits_torch(q, k, k_scale, w, ks, ke))


@pytest.mark.parametrize("next_n", [1, 2])
def test_paged_logits_kernel_matches_reference_in_interpreter(interp, next_n):
    m = interp.triton_indexer_sm8x
    q, cache, w, ctx, bt = paged_case(3, next_n, 32, 16, 40, 100)
    got = m.paged_mqa_logits(q, cache, w, ctx, bt, 112, soft_fp8=True)
    assert_logits_close(got, m.paged_mqa_logits_torch(q, cache, w, ctx, bt, 112))
    # Two-dimensional context lengths (one per draft row) and a request-index remap.
    ctx2 = (ctx[:, None] - next_n + 1 + torch.arange(next_n)).int()
    remap = torch.tensor([2, 0, 1], dtype=torch.int32)
    got = m.paged_mqa_logits(q, cache, w, ctx2, bt[remap.long()], 112, indices=torch.tensor([1, 2, 0]), soft_fp8=True)
    assert_logits_close(got, m.paged_mqa_logits_torch(q, cache, w, ctx, bt, 112))


def test_references_agree_with_vllm_torch_references(interp):
    """The module's references reproduce vLLM's (DeepGEMM test-derived) torch references."""
    ref = pytest.importorskip("vllm.v1.attention.ops.rocm_aiter_mla_sparse")
    m = interp.triton_indexer_sm8x
    q, k, k_scale, w, ks, ke = prefill_case(6, 32, 150)
    # vLLM's prefill reference runs its dot in bf16: compare at bf16 precision.
    got = m.mqa_logits_torch(q, k, k_scale, w, ks, ke)
    want = ref.fp8_mqa_logits_torch(q, (k, k_scale), w, ks, ke)
    inf = torch.isinf(want)
    assert torch.equal(torch.isinf(got), inf)
    assert (got[~inf] - want[~inf]).abs().max() <= 1e-2 * want[~inf].abs().max()
    q, cache, w, ctx, bt = paged_case(3, 1, 32, 16, 40, 100)
    assert_logits_close(m.paged_mqa_logits_torch(q, cache, w, ctx, bt, 112),
                        ref.fp8_paged_mqa_logits_torch(q, cache, w, ctx, bt, 112))


def test_deepgemm_shaped_entry_points_and_switch(interp, monkeypatch):
    m = interp.triton_indexer_sm8x
    monkeypatch.setenv("VLLM_SOFT_FP8_E4M3", "1")  # the interpreter has no FP8 conversion
    q, cache, w, ctx, bt = paged_case(2, 1, 32, 16, 20, 60)
    got = m.fp8_fp4_paged_mqa_logits((q, None), cache, w, ctx[:, None], bt, None, 64)
    assert_logits_close(got, m.paged_mqa_logits_torch(q, cache, w, ctx, bt, 64))
    with pytest.raises(AssertionError, match="FP8 cache only"):
        m.fp8_fp4_paged_mqa_logits((q, q), cache, w, ctx, bt, None, 64)
    monkeypatch.setenv("VLLM_SM8X_INDEXER", "1")
    assert m.fallback_active()
    monkeypatch.setenv("VLLM_SM8X_INDEXER", "0")
    assert not m.fallback_active()


# ---------------------------------------------------------------- GPU


@pytest.mark.gpu
@cuda
@pytest.mark.parametrize("soft", [True, False])
def test_gpu_prefill_logits(native, soft):
    m = native.triton_indexer_sm8x
    case = prefill_case(256, 32, 131072, device="cuda")
    got = m.mqa_logits(*case, soft_fp8=soft)
    err, scale = assert_logits_close(got, m.mqa_logits_torch(*case))
    print(f"prefill logits soft={soft}: max abs err {err:.2e} (max |ref| {scale:.2e})")


@pytest.mark.gpu
@cuda
@pytest.mark.parametrize("next_n", [1, 2])
@pytest.mark.parametrize("soft", [True, False])
def test_gpu_paged_logits_1m_context(native, next_n, soft):
    m = native.triton_indexer_sm8x
    # 1M tokens / pool 4 = 262144 pools per request; 270000 pages of 64 pools = 2.28 GB of keys.
    q, cache, w, ctx, bt = paged_case(16, next_n, 32, 64, 270_000, 262_144, device="cuda")
    bt[0, -4:] = torch.arange(269_996, 270_000, device="cuda", dtype=torch.int32)  # the top of the pool
    ctx[0] = 262_144
    assert 269_999 * cache.stride(0) > 2**31
    got = m.paged_mqa_logits(q, cache, w, ctx, bt, 262_144, soft_fp8=soft)
    err, scale = assert_logits_close(got, m.paged_mqa_logits_torch(q, cache, w, ctx, bt, 262_144))
    print(f"paged logits next_n={next_n} soft={soft}: max abs err {err:.2e} (max |ref| {scale:.2e})")
