"""Patch 0008: software FP8 e4m3 codec, and the kpool stores that use it on GPUs without FP8.

CPU tests (CI) run the torch reference and the Triton kernels (in Triton's interpreter) against
torch's own float8_e4m3fn conversion; GPU tests (marker gpu) run the compiled kernels and check
that the kpool kernels write the same bytes through the software path as through the hardware one.
"""

from __future__ import annotations

import pytest
import torch

ALL_CODES = torch.arange(256, dtype=torch.int32).to(torch.uint8)
EDGES = [0.0, -0.0, float("nan"), float("inf"), -float("inf"), 448.0, -448.0, 449.0, 464.0, 464.001, 479.99,
         480.0, -480.0, 1e6, 2.0**-6, 2.0**-7, 2.0**-9, 2.0**-10, 2.0**-10 * 1.0001, 3 * 2.0**-10, 1.5 * 2.0**-9,
         2.5 * 2.0**-9, 1e-30, -1e-45, 240.0, 248.0, 232.0, 1.0625, 1.1875, -17.0]

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def torch_saturates() -> bool:
    """torch >= 2.13 saturates out-of-range values to +-448; older torch gives NaN."""
    return torch.tensor([1000.0]).to(torch.float8_e4m3fn).view(torch.uint8).item() == 0x7E


def sample_inputs(n: int, device: str = "cpu") -> torch.Tensor:
    gen = torch.Generator(device=device).manual_seed(1234)
    scales = (1e-5, 1e-3, 2.0**-8, 1.0, 30.0, 300.0, 600.0)
    parts = [torch.randn(n, generator=gen, device=device) * s for s in scales]
    codes = ALL_CODES.to(device).view(torch.float8_e4m3fn).to(torch.float32)
    # Exact ties: the midpoints between neighbouring codes must round to even.
    mids = (codes[1:127] + codes[:126]) / 2
    return torch.cat([*parts, torch.tensor(EDGES, device=device), codes, mids, -mids])


def assert_same_bits(got: torch.Tensor, want: torch.Tensor) -> None:
    bad = (got.view(torch.int32) != want.view(torch.int32)).nonzero()
    assert bad.numel() == 0, f"{bad.numel()} mismatches, first at {bad[:4].flatten().tolist()}"


def check_encoder(encode, device: str = "cpu") -> None:
    x = sample_inputs(20000, device)
    want = x.to(torch.float8_e4m3fn).view(torch.uint8)
    mode = torch_saturates()
    assert torch.equal(encode(x, saturate=mode), want)
    # Saturating = clamp first (NaN stays NaN), in either torch version.
    clamped = torch.where(torch.isnan(x), x, x.clamp(-448.0, 448.0))
    assert torch.equal(encode(x, saturate=True), clamped.to(torch.float8_e4m3fn).view(torch.uint8))
    # The older rule: NaN (sign kept) for everything that rounds past 448.
    legacy = encode(x, saturate=False)
    big = x.abs() > 464.0
    assert torch.equal(legacy[~big], clamped[~big].to(torch.float8_e4m3fn).view(torch.uint8))
    assert torch.equal(legacy[big] & 0x7F, torch.full_like(legacy[big], 0x7F))


def test_torch_reference_decodes_all_256_codes_bit_exact(interp):
    want = ALL_CODES.view(torch.float8_e4m3fn).to(torch.float32)
    assert_same_bits(interp.fp8_e4m3_sw.decode_torch(ALL_CODES), want)


def test_triton_decode_all_256_codes_bit_exact_in_interpreter(interp):
    want = ALL_CODES.view(torch.float8_e4m3fn).to(torch.float32)
    assert_same_bits(interp.fp8_e4m3_sw.decode_triton(ALL_CODES), want)


def test_torch_reference_encodes_like_torch(interp):
    check_encoder(interp.fp8_e4m3_sw.encode_torch)


def test_triton_encode_like_torch_in_interpreter(interp):
    check_encoder(interp.fp8_e4m3_sw.encode_triton)


def test_edge_values_encode_to_the_documented_codes(interp):
    enc = interp.fp8_e4m3_sw.encode_torch
    x = torch.tensor([-0.0, float("nan"), 2.0**-10, 3 * 2.0**-10, 464.0, float("inf"), -1e9, 2.0**-9])
    # -0 keeps its sign; 2^-10 ties to even (0); 3*2^-10 ties up to 2*2^-9; 464 ties down to 448.
    assert enc(x).tolist() == [0x80, 0x7F, 0x00, 0x02, 0x7E, 0x7E, 0xFE, 0x01]
    assert enc(x, saturate=False).tolist()[5:7] == [0x7F, 0xFF]


def test_every_code_round_trips(interp):
    c = interp.fp8_e4m3_sw
    finite = (ALL_CODES & 0x7F) != 0x7F
    assert torch.equal(c.encode_torch(c.decode_torch(ALL_CODES))[finite], ALL_CODES[finite])


def test_switch_picks_the_path(interp, monkeypatch):
    c = interp.fp8_e4m3_sw
    monkeypatch.setenv("VLLM_SOFT_FP8_E4M3", "1")
    assert c.use_soft_fp8(torch.device("cpu"))
    monkeypatch.setenv("VLLM_SOFT_FP8_E4M3", "0")
    assert not c.use_soft_fp8(torch.device("cuda", 0))
    monkeypatch.delenv("VLLM_SOFT_FP8_E4M3")
    assert not c.use_soft_fp8(torch.device("cpu"))  # automatic: only CUDA below sm_89
    buf = torch.zeros(4, dtype=torch.uint8)
    assert c.fp8_storage_view(buf, True).dtype == torch.uint8
    assert c.fp8_storage_view(buf, False).dtype == torch.float8_e4m3fn


# ---------------------------------------------------------------- GPU


@pytest.mark.gpu
@cuda
def test_gpu_codec_bit_exact_with_torch_cuda(native):
    c = native.fp8_e4m3_sw
    codes = ALL_CODES.cuda()
    assert_same_bits(c.decode_triton(codes), codes.view(torch.float8_e4m3fn).to(torch.float32))
    check_encoder(c.encode_triton, "cuda")
    x = torch.randn(1 << 22, device="cuda") * 100
    assert torch.equal(c.encode_triton(x), x.clamp(-448, 448).to(torch.float8_e4m3fn).view(torch.uint8))


def _both_paths(monkeypatch, run):
    """Run ``run()`` with the hardware FP8 path, then with the software one."""
    outs = []
    for mode in ("0", "1"):
        monkeypatch.setenv("VLLM_SOFT_FP8_E4M3", mode)
        outs.append(run())
    return outs


@pytest.mark.gpu
@cuda
def test_gpu_kpool_soft_stores_equal_hardware_stores(native, monkeypatch):
    kp = native.kpool_compress
    torch.manual_seed(0)
    dev = "cuda"
    head, pool, page, nblocks = 128, 4, 64, 4096

    q = torch.randn(1000, head, device=dev, dtype=torch.bfloat16) * 3
    hw, sw = _both_paths(monkeypatch, lambda: kp.fwht128_quant_fp8(q))
    assert torch.equal(hw[0].view(torch.uint8), sw[0].view(torch.uint8)) and torch.equal(hw[1], sw[1])
    assert hw[0].view(torch.uint8).any()

    n = 3000
    slot_k = torch.randn(n, pool, head, device=dev, dtype=torch.bfloat16)
    score = torch.randn(n, pool, head, device=dev, dtype=torch.bfloat16)
    ape = torch.randn(pool, head, device=dev)
    loc = torch.randperm(nblocks * page, device=dev)[:n]
    mask = torch.rand(n, device=dev) > 0.2

    def compress():
        cache = torch.zeros(nblocks, page, head + 4, dtype=torch.uint8, device=dev)
        kp.kpool_compress_and_write_cache(cache, slot_k, score, ape, loc, pool, write_mask=mask)
        return cache

    hw, sw = _both_paths(monkeypatch, compress)
    assert torch.equal(hw, sw) and hw.any()

    reqs, next_n = 64, 4
    positions = (torch.randint(0, 10000, (reqs, 1), device=dev) + torch.arange(next_n, device=dev)).int()
    slot_map = torch.where(positions % pool == pool - 1, torch.randint(0, nblocks * page, positions.shape, device=dev),
                           -1).int()
    tail_slot = (torch.arange(reqs, device=dev)[:, None] * pool + positions % pool).int()
    key = torch.randn(reqs, next_n, head, device=dev, dtype=torch.bfloat16)
    sc = torch.randn(reqs, next_n, head, device=dev, dtype=torch.bfloat16)
    tail0 = torch.randn(reqs, 2, pool, head, device=dev, dtype=torch.bfloat16)

    def decode_update():
        cache = torch.zeros(nblocks, page, head + 4, dtype=torch.uint8, device=dev)
        tail = tail0.clone()
        kp.kpool_decode_update_and_maybe_write_cache_batched(
            cache, tail, tail_slot, key, sc, ape, slot_map, positions, pool
        )
        return cache, tail

    hw, sw = _both_paths(monkeypatch, decode_update)
    assert torch.equal(hw[0], sw[0]) and torch.equal(hw[1], sw[1]) and hw[0].any()
