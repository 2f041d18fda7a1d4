"""Patch 0007 on a GPU: the expand kernel with the pool-id bounds check on (VLLM_SPARSE_INDEX_CHECK=1), through the
patched kpool module loaded without vLLM (the kernel tier's `native` modules). In-range ids expand as the two-step
torch path does; an id past the query's pools raises before the Triton kernel reads anything. The CPU tests and the
per_row CUDA top-k (which needs vLLM's CUDA build) are in tests/patches/test_0007_topk_canon_bounds.py."""

from __future__ import annotations

import pytest
import torch


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_gpu_expand_kernel_with_check(native, monkeypatch) -> None:
    kp = native.kpool_compress
    monkeypatch.setenv("VLLM_SPARSE_INDEX_CHECK", "1")
    pool_size = 16
    pool_ids = torch.tensor([[0, 2, -1, 1], [3, 0, 1, 2]], dtype=torch.int32).cuda()
    seq_lens = torch.tensor([50, 70], dtype=torch.int32).cuda()
    got = kp.expand_pools_and_append_tail(pool_ids, seq_lens, pool_size)
    want = kp.append_tail_to_topk(kp.expand_pools_to_tokens(pool_ids, pool_ids >= 0, pool_ids.shape[1] * pool_size,
                                                            pool_size), seq_lens, seq_lens // pool_size, pool_size)
    assert torch.equal(got, want)
    with pytest.raises(IndexError, match="query row 0"):
        kp.expand_pools_and_append_tail(torch.tensor([[0, 3, -1, 1]], dtype=torch.int32).cuda(), seq_lens[:1],
                                        pool_size)
