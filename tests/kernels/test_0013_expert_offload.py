"""Patch 0013: expert offload kernels (top-k remap to [cache | staging] slots, miss gather from pinned host).

CPU tests (CI) check the torch reference remap and gather against plain torch indexing written here, and the
Triton kernels in Triton's interpreter against the reference; GPU tests (marker gpu) run the compiled kernels
bit for bit against the reference, eager and captured in a CUDA graph and replayed, the gather reading a
zero-copy view of pinned host memory.
"""

from __future__ import annotations

import pytest
import torch


cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def slot_map(n_experts: int, hot: list[int]) -> torch.Tensor:
    slots = torch.full((n_experts,), -1, dtype=torch.int32)
    slots[torch.tensor(hot, dtype=torch.long)] = torch.arange(len(hot), dtype=torch.int32)
    return slots


def expected_remap(ids: torch.Tensor, slots: torch.Tensor, n_cache: int, staging: int):
    """The remap's contract spelt out with Python loops (independent of the implementation)."""
    misses = sorted({int(x) for x in ids.flatten() if 0 <= x < slots.numel() and slots[x] < 0})
    stage = {e: i for i, e in enumerate(misses[:staging])}
    out = [-1 if not 0 <= x < slots.numel() else int(slots[x]) if slots[x] >= 0 else n_cache + stage[int(x)]
           if int(x) in stage else -1 for x in ids.flatten().tolist()]
    lst = misses[:staging] + [-1] * (staging - min(staging, len(misses)))
    return torch.tensor(out, dtype=torch.int32).view(ids.shape), torch.tensor(lst, dtype=torch.int32), len(misses)


def random_case(seed: int, n_experts: int = 288, n_cache: int = 54, tokens: int = 4, top_k: int = 8):
    gen = torch.Generator().manual_seed(seed)
    hot = torch.randperm(n_experts, generator=gen)[:n_cache].tolist()
    ids = torch.stack([torch.randperm(n_experts, generator=gen)[:top_k] for _ in range(tokens)]).to(torch.int32)
    return ids, slot_map(n_experts, hot)


CASES = {
    "all_hits": (torch.tensor([[0, 1, 2], [2, 1, 0]], dtype=torch.int32), slot_map(8, [2, 0, 1]), 3, 4),
    "all_misses": (torch.tensor([[5, 6, 7], [3, 4, 5]], dtype=torch.int32), slot_map(8, [0, 1, 2]), 3, 8),
    "duplicates": (torch.tensor([[7, 7, 3], [3, 7, 0], [0, 0, 0]], dtype=torch.int32), slot_map(8, [0]), 1, 4),
    "overflow": (torch.tensor([[1, 2, 3, 4], [5, 6, 7, 0]], dtype=torch.int32), slot_map(8, [0]), 1, 3),
    "out_of_range_ids": (torch.tensor([[-1, 9, 2], [3, 8, 2]], dtype=torch.int32), slot_map(8, [3]), 1, 2),
    "int64_ids": (torch.tensor([[4, 5], [6, 4]], dtype=torch.int64), slot_map(8, [5]), 1, 4),
    "decode_batch": (*random_case(1), 54, 64),
    "prefill_overflow": (*random_case(2, tokens=40), 54, 64),
}


@pytest.mark.parametrize("case", CASES)
def test_remap_reference_matches_contract(ko, case):
    ids, slots, n_cache, staging = CASES[case]
    remapped, lst, count = ko.remap_reference(ids, slots, n_cache, staging)
    want_ids, want_list, want_count = expected_remap(ids, slots, n_cache, staging)
    assert torch.equal(remapped, want_ids)
    assert torch.equal(lst, want_list)
    assert count.tolist() == [want_count]
    assert bool(ko.overflowed(count, staging)) == (want_count > staging)


@pytest.mark.parametrize("case", CASES)
def test_remap_triton_interpreted_matches_reference(ko, case, monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    ids, slots, n_cache, staging = CASES[case]
    got = ko.remap_topk(ids, slots, n_cache, staging, use_triton=True)
    for g, w in zip(got, ko.remap_reference(ids, slots, n_cache, staging)):
        assert torch.equal(g, w)


def test_remapped_ids_index_cache_and_staging(ko):
    """The MoE kernel's view: [cache | staging][remapped] is the expert the router picked."""
    ids, slots, n_cache, staging = CASES["decode_batch"]
    experts = torch.randn(288, 3)
    cache = experts[(slots >= 0).nonzero().squeeze(1)[slots[slots >= 0].argsort()]]
    remapped, lst, count = ko.remap_reference(ids, slots, n_cache, staging)
    stage = ko.gather_reference(experts, lst, torch.zeros(staging, 3))
    assert torch.equal(torch.cat([cache, stage])[remapped.long()], experts[ids.long()])


def test_overflow_is_an_error_where_syncing_is_allowed(ko):
    ids, slots, n_cache, staging = CASES["overflow"]
    remapped, lst, count = ko.remap_reference(ids, slots, n_cache, staging)
    assert count.item() == 7 and bool(ko.overflowed(count, staging))
    assert (remapped == -1).sum() == 4  # the misses past the staging size have no slot, never a wrong one
    with pytest.raises(ValueError, match="7 distinct experts missed but the staging buffer holds 3"):
        ko.check_overflow(count, staging)
    ko.check_overflow(ko.remap_reference(*CASES["duplicates"])[2], 4)


def test_check_slot_map_rejects_bad_maps(ko):
    ko.check_slot_map(slot_map(8, [3, 1]), 2)
    with pytest.raises(ValueError, match="outside"):
        ko.check_slot_map(slot_map(8, [3, 1, 2]), 2)
    with pytest.raises(ValueError, match="two experts"):
        ko.check_slot_map(torch.tensor([0, 0, -1], dtype=torch.int32), 2)
    with pytest.raises(ValueError, match="int32"):
        ko.check_slot_map(torch.tensor([0, -1]), 2)


def host_experts(n_experts: int, shape: tuple[int, ...], dtype: torch.dtype, pin: bool = False) -> torch.Tensor:
    gen = torch.Generator().manual_seed(7)
    bits = torch.randint(0, 256, (n_experts, *shape, torch.tensor([], dtype=dtype).element_size()),
                         dtype=torch.uint8, generator=gen)
    out = bits.view(dtype).reshape(n_experts, *shape)
    return out.pin_memory() if pin else out


def zero_rows(n: int, shape: tuple[int, ...], dtype: torch.dtype, device: str = "cpu") -> torch.Tensor:
    size = torch.tensor([], dtype=dtype).element_size()
    return torch.zeros((n, *shape, size), dtype=torch.uint8, device=device).view(dtype).reshape(n, *shape)


GATHER_LISTS = {
    "some": [5, 0, 9, -1, -1],
    "none": [-1, -1, -1, -1, -1],
    "full": [11, 3, 4, 2, 1],
}


@pytest.mark.parametrize("name", GATHER_LISTS)
@pytest.mark.parametrize("dtype,shape", [(torch.uint8, (6, 40)), (torch.float8_e4m3fn, (3, 7)),
                                         (torch.bfloat16, (2, 33))])
def test_gather_reference_and_interpreted_triton(ko, name, dtype, shape, monkeypatch):
    src = host_experts(12, shape, dtype)
    lst = torch.tensor(GATHER_LISTS[name], dtype=torch.int32)
    count = (lst >= 0).sum().to(torch.int32).view(1)
    want = zero_rows(5, shape, dtype)
    for s, e in enumerate(lst.tolist()):
        if e >= 0:
            want[s] = src[e]
    got = ko.gather_misses(src, lst, count, torch.zeros_like(want))
    assert torch.equal(got.view(torch.uint8), want.view(torch.uint8))
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    tri = ko.gather_misses(src, lst, count, torch.zeros_like(want), use_triton=True, block=16, chunk=32,
                           programs=3)
    assert torch.equal(tri.view(torch.uint8), want.view(torch.uint8))


def test_gather_rejects_mismatched_staging(ko):
    src = host_experts(4, (8,), torch.uint8)
    lst, count = torch.tensor([1, -1], dtype=torch.int32), torch.tensor([1], dtype=torch.int32)
    with pytest.raises(ValueError, match="differ from staging rows"):
        ko.gather_misses(src, lst, count, torch.zeros(2, 9, dtype=torch.uint8))
    with pytest.raises(ValueError, match="3 list entries for 2 staging slots"):
        ko.gather_misses(src, torch.tensor([1, -1, -1], dtype=torch.int32), count, torch.zeros(2, 8, dtype=torch.uint8))


@pytest.mark.gpu
@cuda
@pytest.mark.parametrize("case", CASES)
def test_remap_gpu_matches_reference_eager_and_graphed(kn, case):
    ids, slots, n_cache, staging = CASES[case]
    want = kn.remap_reference(ids, slots, n_cache, staging)
    d_ids, d_slots = ids.cuda(), slots.cuda()
    got = kn.remap_topk(d_ids, d_slots, n_cache, staging)
    for g, w in zip(got, want):
        assert torch.equal(g.cpu(), w)
    out = (torch.empty(ids.shape, dtype=torch.int32, device="cuda"), torch.empty(staging, dtype=torch.int32,
           device="cuda"), torch.empty(1, dtype=torch.int32, device="cuda"),
           torch.empty(slots.numel(), dtype=torch.int32, device="cuda"))
    kn.remap_topk(d_ids, d_slots, n_cache, staging, out=out)  # compile outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        kn.remap_topk(d_ids, d_slots, n_cache, staging, out=out)
    for o in out:
        o.fill_(-7)
    # Replay on new ids of the same shape: the graph reads the buffers, not the values it was captured with.
    new_ids = torch.randint(0, slots.numel(), ids.shape, dtype=ids.dtype)
    d_ids.copy_(new_ids)
    graph.replay()
    torch.cuda.synchronize()
    for g, w in zip(out[:3], kn.remap_reference(new_ids, slots, n_cache, staging)):
        assert torch.equal(g.cpu(), w)


@pytest.mark.gpu
@cuda
@pytest.mark.parametrize("dtype,shape", [(torch.uint8, (64, 1000)), (torch.uint8, (3, 7)),
                                         (torch.float8_e4m3fn, (128, 515))])
def test_gather_gpu_from_pinned_host_matches_reference(kn, dtype, shape):
    n_experts, staging = 40, 8
    host = host_experts(n_experts, shape, dtype, pin=True)
    view = kn.host_view_on_device(host)
    assert view.is_cuda and view.data_ptr() == host.data_ptr()
    for lst_values in ([39, 0, 17, 5, -1, -1, -1, -1], [-1] * 8, list(range(30, 38))):
        lst = torch.tensor(lst_values, dtype=torch.int32)
        count = (lst >= 0).sum().to(torch.int32).view(1)
        want = kn.gather_reference(host, lst, zero_rows(staging, shape, dtype))
        d_lst, d_count = lst.cuda(), count.cuda()
        dst = zero_rows(staging, shape, dtype, "cuda")
        kn.gather_misses(view, d_lst, d_count, dst)
        assert torch.equal(dst.cpu().view(torch.uint8), want.view(torch.uint8))
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            kn.gather_misses(view, d_lst, d_count, dst)
        dst.view(torch.uint8).zero_()
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(dst.cpu().view(torch.uint8), want.view(torch.uint8))


@pytest.mark.gpu
@cuda
def test_remap_then_gather_in_one_graph(kn):
    """A whole decode step's offload part, captured once and replayed on new routing: no host sync."""
    n_experts, n_cache, staging = 288, 54, 64
    ids, slots = random_case(3, n_experts, n_cache, tokens=8)
    host = host_experts(n_experts, (4096,), torch.uint8, pin=True)
    view = kn.host_view_on_device(host)
    d_ids, d_slots = ids.cuda(), slots.cuda()
    out = (torch.empty(ids.shape, dtype=torch.int32, device="cuda"), torch.empty(staging, dtype=torch.int32,
           device="cuda"), torch.empty(1, dtype=torch.int32, device="cuda"),
           torch.empty(n_experts, dtype=torch.int32, device="cuda"))
    dst = torch.zeros(staging, 4096, dtype=torch.uint8, device="cuda")
    kn.gather_misses(view, *kn.remap_topk(d_ids, d_slots, n_cache, staging, out=out)[1:], dst)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        kn.gather_misses(view, *kn.remap_topk(d_ids, d_slots, n_cache, staging, out=out)[1:], dst)
    for seed in (4, 5):
        new_ids, _ = random_case(seed, n_experts, n_cache, tokens=8)
        d_ids.copy_(new_ids)
        graph.replay()
        torch.cuda.synchronize()
        _, lst, _ = kn.remap_reference(new_ids, slots, n_cache, staging)
        want = kn.gather_reference(host, lst, torch.zeros(staging, 4096, dtype=torch.uint8))
        assert torch.equal(out[1].cpu(), lst)
        valid = lst >= 0
        assert torch.equal(dst.cpu()[valid], want[valid])
