"""Patch 0007: canonical sparse-indexer top-k order (GLM53_TOPK_CANON=1) and a
pool-id bounds check (VLLM_SPARSE_INDEX_CHECK=1).

The canonical form is checked against a brute-force reference on CPU, through
the real SparseIndexerTopk dispatcher (its "torch" backend runs on CPU). The
bounds check is exercised through the real expand_pools_and_append_tail, which
must raise before its (GPU-only) Triton kernel would read anything. The GPU
tests (vLLM's CUDA top-k kernels under the switch, the expand kernel with the
check) are in the kernel tier, tests/kernels/test_0007_device.py.
"""

from __future__ import annotations

import pytest
import torch

from vllm.model_executor.layers import indexer_topk
from vllm.models.glm5next.nvidia.ops import kpool_compress

from testing.topk_reference import canonical_topk, tied_logits


def test_any_valid_kernel_output_maps_to_the_canonical_row():
    rows, width, k = 6, 40, 8
    logits = tied_logits(rows, width, seed=1)
    row_ends = [40, 25, 8, 5, 0, 13]
    counts = [min(k, end) for end in row_ends]
    want = canonical_topk(logits, row_ends, counts, k)
    ends = torch.tensor(row_ends, dtype=torch.int32)
    gen = torch.Generator().manual_seed(7)
    for _ in range(5):
        # A kernel's output: some valid top-k set (ties broken at random), in
        # any order, -1 padded.
        got = torch.full((rows, k), -1, dtype=torch.int32)
        for row, (end, count) in enumerate(zip(row_ends, counts)):
            noise = torch.rand(end, generator=gen) * 0.5  # breaks ties randomly
            pick = torch.topk(logits[row, :end] + noise, count).indices
            pick = pick[torch.randperm(count, generator=gen)]
            got[row, :count] = pick.to(torch.int32)
        indexer_topk.canonicalize_topk_indices_(logits, got, ends)
        assert torch.equal(got, want)


def test_kernel_count_is_kept_and_wide_k_is_padded():
    logits = torch.tensor([[5.0, 1.0, 5.0, 3.0], [2.0, 2.0, 2.0, 2.0]])
    # Row 0: the kernel kept 2 (both 5s, reversed). Row 1: it kept 1 of 4 ties.
    got = torch.tensor(
        [[2, 0, -1, -1, -1, -1], [3, -1, -1, -1, -1, -1]], dtype=torch.int32
    )
    indexer_topk.canonicalize_topk_indices_(
        logits, got, torch.tensor([4, 4], dtype=torch.int32)
    )
    assert got.tolist() == [[0, 2, -1, -1, -1, -1], [0, -1, -1, -1, -1, -1]]


def _decode_topk(monkeypatch, canon: bool, logits, seq_lens, k):
    if canon:
        monkeypatch.setenv("GLM53_TOPK_CANON", "1")
    else:
        monkeypatch.delenv("GLM53_TOPK_CANON", raising=False)
    topk = indexer_topk.SparseIndexerTopk("torch")
    out = torch.empty((logits.shape[0], k), dtype=torch.int32)
    topk(logits, seq_lens, 1, out, k, int(seq_lens.max()))
    return out


def _decode_case():
    k = 8
    logits = tied_logits(4, 64, seed=3)
    seq_lens = torch.tensor([[64], [30], [9], [3]], dtype=torch.int32)
    ends = [64, 30, 9, 3]
    return k, logits, seq_lens, ends


@pytest.mark.upstream_guard
def test_unset_switch_keeps_the_backend_output(monkeypatch):
    k, logits, seq_lens, ends = _decode_case()
    plain = _decode_topk(monkeypatch, False, logits, seq_lens, k)
    # The torch backend's own answer: masked torch.topk, -1 past the row end.
    masked = logits.masked_fill(
        torch.arange(64).unsqueeze(0) >= torch.tensor(ends).unsqueeze(1), float("-inf")
    )
    upstream = masked.topk(k, dim=-1).indices
    upstream = torch.where(
        torch.arange(k).unsqueeze(0) < torch.tensor(ends).unsqueeze(1), upstream, -1
    )
    assert torch.equal(plain, upstream.to(torch.int32))


def test_switch_makes_the_dispatcher_output_canonical(monkeypatch):
    k, logits, seq_lens, ends = _decode_case()
    counts = [min(k, e) for e in ends]
    plain = _decode_topk(monkeypatch, False, logits, seq_lens, k)
    canon = _decode_topk(monkeypatch, True, logits, seq_lens, k)
    assert torch.equal(canon, canonical_topk(logits, ends, counts, k))
    # Same scores as the backend chose; only tie members and order differ.
    for row in range(4):
        n = counts[row]
        assert sorted(logits[row, canon[row, :n].long()].tolist()) == sorted(
            logits[row, plain[row, :n].long()].tolist()
        )


def test_out_of_bounds_pool_id_fails_loudly(monkeypatch):
    monkeypatch.setenv("VLLM_SPARSE_INDEX_CHECK", "1")
    # Row 1 has seq_len 40 -> 2 complete pools of 16 (ids 0 and 1); id 2 would
    # expand to tokens 32..47, past what the request wrote.
    pool_ids = torch.tensor([[0, 1, -1], [1, 2, 0]], dtype=torch.int32)
    seq_lens = torch.tensor([48, 40], dtype=torch.int32)
    with pytest.raises(IndexError) as err:
        kpool_compress.expand_pools_and_append_tail(
            pool_ids, seq_lens, 16, layer_name="model.layers.3.self_attn.indexer"
        )
    message = str(err.value)
    for fragment in (
        "model.layers.3.self_attn.indexer",
        "query row 1",
        "pool 2",
        "32..47",
        "seq_len is 40",
    ):
        assert fragment in message

    # In-bounds ids (and -1 padding) pass the same check.
    kpool_compress.check_pool_ids_in_bounds(
        torch.tensor([[0, 1, -1], [1, 0, -1]], dtype=torch.int32), seq_lens, 16
    )
    with pytest.raises(IndexError, match="pool -3"):
        kpool_compress.check_pool_ids_in_bounds(
            torch.tensor([[-3]], dtype=torch.int32), seq_lens, 16
        )
