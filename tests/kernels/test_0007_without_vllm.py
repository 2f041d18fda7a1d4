"""Patch 0007 without vLLM installed (the kernel tier):

- on CPU, the patched top-k dispatcher as the GPU tests load it, its torch backend under the switch: the loader's
  stand-ins still fit the pinned file;
- on a GPU, the same dispatcher over vLLM's own compiled CUDA top-k kernels (the pinned GPU package's
  _C_stable_libtorch.abi3.so): under GLM53_TOPK_CANON=1 every kernel this GPU can run gives the canonical rows,
  eagerly and replayed in a CUDA graph; without it their rows are the kernels' own (the same scores, other tie members
  or order), which is what the switch exists for;
- the expand kernel with the pool-id bounds check on (VLLM_SPARSE_INDEX_CHECK=1), through the patched kpool module.

The CPU tests are in tests/patches/test_0007_topk_canon_bounds.py."""

from __future__ import annotations

import pytest
import torch

from rigstack.bench import kernel_sources
from testing.topk_reference import canonical_topk, tied_logits

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
K = 2048  # the width the decode kernels are built for
# The CUDA kernels the dispatcher can name; which of them this GPU runs, its resolve_backend says.
CUDA_BACKENDS = ("per_row", "persistent", "cooperative")


@pytest.fixture(scope="module")
def indexer_topk():
    if torch.cuda.is_available():
        kernel_sources.load_cuda_ops()
    return kernel_sources.load_indexer_topk()


def _case(seed: int, device: str = "cuda") -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    logits = tied_logits(8, 4096, seed=seed).to(device)
    seq_lens = torch.tensor([[4096], [3000], [2048], [2049], [3], [4000], [128], [2500]], dtype=torch.int32).to(device)
    ends = seq_lens.flatten().tolist()
    return logits, seq_lens, canonical_topk(logits.cpu(), ends, [min(K, end) for end in ends], K)


def _topk(indexer_topk, monkeypatch, backend: str, canonical: bool, logits, seq_lens) -> torch.Tensor:
    if canonical:
        monkeypatch.setenv("GLM53_TOPK_CANON", "1")
    else:
        monkeypatch.delenv("GLM53_TOPK_CANON", raising=False)
    out = torch.empty((logits.shape[0], K), dtype=torch.int32, device=logits.device)
    indexer_topk.SparseIndexerTopk(backend)(logits, seq_lens, 1, out, K, int(seq_lens.max()))
    return out.cpu()


def _runnable(indexer_topk, logits) -> list[str]:
    names = []
    for backend in CUDA_BACKENDS:
        try:
            indexer_topk.SparseIndexerTopk(backend).resolve_backend(logits, K, logits.shape[0])
        except RuntimeError:  # the dispatcher's own refusal: not on this GPU
            continue
        names.append(backend)
    return names


def test_loaded_dispatcher_gives_canonical_rows_on_cpu(indexer_topk, monkeypatch) -> None:
    logits, seq_lens, want = _case(seed=5, device="cpu")
    assert torch.equal(_topk(indexer_topk, monkeypatch, "torch", True, logits, seq_lens), want)
    # Without the switch, torch.topk's own tie members and order: the rows differ.
    assert not torch.equal(_topk(indexer_topk, monkeypatch, "torch", False, logits, seq_lens), want)


@pytest.mark.gpu
@needs_cuda
def test_gpu_decode_topk_kernels_are_canonical_under_the_switch(indexer_topk, monkeypatch) -> None:
    logits, seq_lens, want = _case(seed=5)
    backends = _runnable(indexer_topk, logits)
    # per_row and persistent run on any CUDA GPU (persistent is what "auto" picks on the SM8x rigs).
    assert {"per_row", "persistent"} <= set(backends), backends
    raw_differs = []
    for backend in backends:
        canon = _topk(indexer_topk, monkeypatch, backend, True, logits, seq_lens)
        assert torch.equal(canon, want), backend
        raw = _topk(indexer_topk, monkeypatch, backend, False, logits, seq_lens)
        for row, count in enumerate((want >= 0).sum(dim=1).tolist()):
            # The kernel kept as many, of the same scores: the switch changes only tie members and order.
            assert int((raw[row] >= 0).sum()) == count, (backend, row)
            assert sorted(logits[row, raw[row, :count].long()].tolist()) == \
                sorted(logits[row, want[row, :count].long()].tolist()), (backend, row)
        raw_differs.append(not torch.equal(raw, want))
    assert any(raw_differs), f"every kernel ({backends}) already gives the canonical rows: the switch does nothing"


@pytest.mark.gpu
@needs_cuda
def test_gpu_canonical_topk_replays_in_a_cuda_graph(indexer_topk, monkeypatch) -> None:
    # No host sync in the kernel or the canonical pass: captured once, a replay on new scores gives their rows.
    monkeypatch.setenv("GLM53_TOPK_CANON", "1")
    first, seq_lens, _ = _case(seed=5)
    new_logits, _, want = _case(seed=11)
    max_seq_len = int(seq_lens.max())  # a host value, read before the capture
    for backend in _runnable(indexer_topk, first):
        logits = first.clone()  # the graph's input buffer, refilled below
        topk = indexer_topk.SparseIndexerTopk(backend)
        out = torch.empty((logits.shape[0], K), dtype=torch.int32, device="cuda")
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            topk(logits, seq_lens, 1, out, K, max_seq_len)  # warm-up outside the capture
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            topk(logits, seq_lens, 1, out, K, max_seq_len)
        logits.copy_(new_logits)
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(out.cpu(), want), backend


@pytest.mark.gpu
@needs_cuda
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
