"""Patch 0009: the Triton sparse-MLA kernel behind TRITON_MLA_SPARSE.

CPU tests (CI): the in-kernel FP8 byte decode over all 256 codes, the int64 row-offset math past
2**31 bytes, and the kernel (in Triton's interpreter) against the plain torch implementation on
small inputs. GPU tests (marker gpu): GLM-5.3-Flash shapes (64 heads, top-k 2048, decode batch 1 to
64, a KV pool past 2**31 bytes) against a float32 torch reference.

Error bound, stated: the kernel rounds q, K chunks and softmax weights to bf16 for the tensor-core
dots, so against a float32 reference max |out - ref| <= 1e-2 * max |ref| and max |lse - ref| <= 2e-2.
"""

from __future__ import annotations

import pytest
import torch

ROW = 656
OUT_TOL = 1e-2
LSE_TOL = 2e-2

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def make_case(m, rows, tokens, heads, topk, rope, bf16_cache=False, device="cpu", seed=0):
    gen = torch.Generator(device=device).manual_seed(seed)
    nope = torch.randn(rows, 512, generator=gen, device=device)
    pe = torch.randn(rows, 64, generator=gen, device=device) if rope else None
    if bf16_cache:
        kv = (torch.cat([nope, pe], 1) if rope else nope).to(torch.bfloat16)
    else:
        kv = m.pack_fp8_ds_mla_torch(nope, pe)
    q = torch.randn(tokens, heads, 512, generator=gen, device=device).to(torch.bfloat16)
    q_pe = torch.randn(tokens, heads, 64, generator=gen, device=device).to(torch.bfloat16) if rope else None
    idx = torch.randint(0, rows, (tokens, topk), generator=gen, device=device, dtype=torch.int32)
    return kv, q, q_pe, idx


def assert_close(out, lse, ref_out, ref_lse):
    scale = ref_out.float().abs().max().clamp_min(1e-6)
    err = (out.float() - ref_out.float()).abs().max()
    assert err <= OUT_TOL * scale, f"max abs err {err:.3e} > {OUT_TOL} * {scale:.3e}"
    assert torch.equal(torch.isinf(lse), torch.isinf(ref_lse))
    finite = torch.isfinite(ref_lse)
    assert (lse[finite] - ref_lse[finite]).abs().max() <= LSE_TOL
    return float(err), float(scale)


def test_fast_byte_decode_is_exact_for_all_256_codes(interp):
    codes = torch.arange(256, dtype=torch.int32).to(torch.uint8)
    want = codes.view(torch.float8_e4m3fn).to(torch.float32) / 256
    got = interp.triton_sparse_mla_sm8x.decode_bytes_bf16_div256(codes).to(torch.float32)
    nan = torch.isnan(want)
    assert torch.equal(torch.isnan(got), nan) and torch.equal(got[~nan].view(torch.int32), want[~nan].view(torch.int32))


def test_row_offsets_are_int64_past_2_31_bytes(interp):
    m = interp.triton_sparse_mla_sm8x
    rows = torch.tensor([-1, 0, 1, 3_273_603, 3_273_604, 10_000_000, 2**31 - 1], dtype=torch.int32)
    got = m.fp8_ds_mla_row_byte_offsets(rows)
    assert got.dtype == torch.int64
    assert got.tolist() == [-1, 0, 656, 3_273_603 * 656, 3_273_604 * 656, 6_560_000_000, (2**31 - 1) * 656]
    assert got[4] > 2**31 - 1  # the first row whose offset an int32 would wrap
    assert (rows[4] * ROW).item() < 0  # ...as the int32 product does


def test_packer_round_trips_through_torch_reference(interp):
    m = interp.triton_sparse_mla_sm8x
    nope, pe = torch.randn(64, 512), torch.randn(64, 64)
    got_nope, got_pe = m.unpack_fp8_ds_mla_torch(m.pack_fp8_ds_mla_torch(nope, pe))
    assert (got_nope - nope).abs().max() <= nope.abs().max() / 16  # e4m3: 3 mantissa bits
    assert torch.equal(got_pe, pe.to(torch.bfloat16).float())


@pytest.mark.parametrize("rope,bf16_cache", [(False, False), (True, False), (False, True), (True, True)])
@pytest.mark.parametrize("splits", [1, 3])
def test_kernel_matches_torch_in_interpreter(interp, rope, bf16_cache, splits):
    m = interp.triton_sparse_mla_sm8x
    kv, q, q_pe, idx = make_case(m, rows=300, tokens=3, heads=20, topk=96, rope=rope, bf16_cache=bf16_cache)
    idx[0, 5:40] = -1  # masked
    idx[1, :] = -1  # a token with nothing to attend to: lse -inf, output 0
    idx[2, 7] = 300 + 5  # past the last row: masked, never read
    out, lse = m.sparse_mla_fwd(q, q_pe, kv, idx, 0.05, soft_fp8=True, num_splits=splits)
    ref_out, ref_lse = m.sparse_mla_torch(q, q_pe, kv, idx, 0.05)
    assert_close(out, lse, ref_out, ref_lse)
    assert torch.isneginf(lse[1]).all() and not out[1].any()


def test_split_choice_fills_the_gpu(interp):
    pick = interp.triton_sparse_mla_sm8x.pick_num_splits
    assert pick(1, 1, 2048, 64, 132) == 16  # decode batch 1: as many splits as allowed
    assert pick(8, 1, 2048, 64, 132) == 16
    assert pick(32, 1, 2048, 64, 132) == 4
    assert pick(64, 1, 2048, 64, 132) == 2
    assert pick(700, 1, 2048, 64, 132) == 1  # prefill: no split, no partials


def test_backend_is_registered_and_accepts_sm8x():
    """The real package: TRITON_MLA_SPARSE is a backend name, valid on SM8x for GLM5Next's NoPE 512
    with packed or bf16 KV, and --kv-cache-dtype fp8 becomes fp8_ds_mla for it."""
    pytest.importorskip("vllm")
    from vllm.model_executor.layers.attention.mla_attention import _canonicalize_sparse_mla_kv_cache_dtype
    from vllm.platforms.interface import DeviceCapability
    from vllm.v1.attention.backends.registry import AttentionBackendEnum

    backend = AttentionBackendEnum["TRITON_MLA_SPARSE"].get_class()
    common = dict(dtype=torch.bfloat16, block_size=128, use_mla=True, has_sink=False, use_sparse=True,
                  use_mm_prefix=False, use_per_head_quant_scales=False, attn_type="decoder")
    for head_size, kv, cap in ((512, "fp8_ds_mla", (8, 0)), (512, "auto", (8, 6)), (576, "fp8", (8, 9))):
        assert backend.validate_configuration(head_size=head_size, kv_cache_dtype=kv,
                                              device_capability=DeviceCapability(*cap), **common) == []
    assert backend.validate_configuration(head_size=512, kv_cache_dtype="fp8_e5m2",
                                          device_capability=DeviceCapability(8, 0), **common)
    assert _canonicalize_sparse_mla_kv_cache_dtype(backend, "fp8") == "fp8_ds_mla"


# ---------------------------------------------------------------- GPU


@pytest.fixture(scope="module")
def big_pool(native):
    """A packed pool of 3.4M rows (2.23 GB, past 2**31 bytes) and a bf16 576 pool of 3.8M rows
    (2.19G elements, past 2**31 elements)."""
    m = native.triton_sparse_mla_sm8x
    torch.manual_seed(0)
    rows = 3_400_000
    kv = torch.empty(rows, ROW, dtype=torch.uint8, device="cuda")
    for start in range(0, rows, 1 << 20):
        n = min(1 << 20, rows - start)
        kv[start : start + n] = m.pack_fp8_ds_mla_torch(
            torch.randn(n, 512, device="cuda"), torch.randn(n, 64, device="cuda")
        )
    bf16_rows = 3_800_000
    kv16 = torch.randn(bf16_rows, 576, device="cuda", dtype=torch.bfloat16)
    return kv, kv16


def gpu_indices(tokens, topk, rows):
    idx = torch.randint(0, rows, (tokens, topk), device="cuda", dtype=torch.int32)
    idx[:, :64] = rows - 1 - torch.arange(64, device="cuda", dtype=torch.int32)  # the top of the pool
    idx[:, 64:80] = -1
    return idx


@pytest.mark.gpu
@cuda
@pytest.mark.parametrize("batch", [1, 8, 64])
@pytest.mark.parametrize("soft", [True, False])
@pytest.mark.parametrize("rope", [False, True])
def test_gpu_decode_glm53_flash_shapes(native, big_pool, batch, soft, rope):
    m = native.triton_sparse_mla_sm8x
    kv, _ = big_pool
    heads, topk = 64, 2048
    q = torch.randn(batch, heads, 512, device="cuda").to(torch.bfloat16)
    q_pe = torch.randn(batch, heads, 64, device="cuda").to(torch.bfloat16) if rope else None
    idx = gpu_indices(batch, topk, kv.shape[0])
    assert int(idx.max()) * ROW > 2**31
    out, lse = m.sparse_mla_fwd(q, q_pe, kv, idx, 576**-0.5, soft_fp8=soft)
    ref_out, ref_lse = m.sparse_mla_torch(q, q_pe, kv, idx, 576**-0.5)
    err, scale = assert_close(out, lse, ref_out, ref_lse)
    print(f"decode batch={batch} soft={soft} rope={rope}: max abs err {err:.2e} (max |ref| {scale:.2e})")


@pytest.mark.gpu
@cuda
def test_gpu_prefill_and_odd_heads_and_bf16_cache(native, big_pool):
    m = native.triton_sparse_mla_sm8x
    kv, kv16 = big_pool
    # Prefill-sized batch (no split), 20 heads (head masking), buffer width 2176 like glm5next's.
    q = torch.randn(700, 20, 512, device="cuda").to(torch.bfloat16)
    idx = gpu_indices(700, 2176, kv.shape[0])
    idx[:, 2051:] = -1
    out, lse = m.sparse_mla_fwd(q, None, kv, idx, 0.06)
    assert_close(out, lse, *m.sparse_mla_torch(q, None, kv, idx, 0.06))
    # bf16 cache with RoPE, element offsets past 2**31.
    q_pe = torch.randn(16, 64, 64, device="cuda").to(torch.bfloat16)
    q = torch.randn(16, 64, 512, device="cuda").to(torch.bfloat16)
    idx = gpu_indices(16, 2048, kv16.shape[0])
    assert int(idx.max()) * 576 > 2**31
    out, lse = m.sparse_mla_fwd(q, q_pe, kv16, idx, 576**-0.5)
    assert_close(out, lse, *m.sparse_mla_torch(q, q_pe, kv16, idx, 576**-0.5))


@pytest.mark.gpu
@cuda
def test_gpu_split_and_unsplit_agree(native, big_pool):
    m = native.triton_sparse_mla_sm8x
    kv, _ = big_pool
    q = torch.randn(4, 64, 512, device="cuda").to(torch.bfloat16)
    idx = gpu_indices(4, 2048, kv.shape[0])
    one, lse1 = m.sparse_mla_fwd(q, None, kv, idx, 0.05, num_splits=1)
    many, lse8 = m.sparse_mla_fwd(q, None, kv, idx, 0.05, num_splits=8)
    assert (one.float() - many.float()).abs().max() <= 1e-2 * one.float().abs().max()
    assert (lse1 - lse8).abs().max() <= 1e-4
