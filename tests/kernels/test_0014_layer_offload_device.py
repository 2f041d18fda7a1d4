"""Patch 0014's LayerOffload (with 0019's prefetch) on a device, against the same layer with every expert resident.

The kernel is a torch MoE over whatever tensors the layer's parameters hold, with exact arithmetic: weights and
inputs in {-1, 0, 1}, routing weights multiples of 1/8, so every sum any path forms is exact in float32 and float64
and the order a path adds in cannot change a bit. An output that differs is a wrong expert, slot or row that the
offload moved. vLLM's Triton fused MoE is not on the GPU machines this runs on (no vLLM there); this kernel keeps the
contract the layer relies on (ids index the layer's current tensors; a -1 id is a pick to skip), not its rounding.

The CPU case runs in CI (the torch reference paths). The CUDA case (marker gpu, `make gpu`) runs what only CUDA
takes: the Triton remap and gather from pinned host memory, the zero-copy host view of the direct path, the -1 skip
of grouped prefill (CPU keeps a valid id at weight 0), CUDA-graph capture and replay of the staged path with and
without prefetch, 0019's side-stream gather forked and joined inside the graph, and 0019's one staging region
mapped behind every layer (cuMemCreate/cuMemMap; on CPU a memfd), which every test here runs with.
"""

from __future__ import annotations

import pytest
import torch

from rigstack.bench import kernel_sources

E, H, INTER, TOP_K = 32, 64, 16, 4
CACHE, STAGING, PREFETCH = 8, 16, 4
GROUPED_MIN_TOKENS = 24  # 5 tokens x 4 picks overflow the 16 staging slots but stay direct; 32 tokens are grouped
TOKENS = {"staged": 3, "direct": 5, "grouped": 32}
HAS_CUDA = torch.cuda.is_available()
needs_cuda = [pytest.mark.gpu, pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU")]
DEVICES = ["cpu", pytest.param("cuda", marks=needs_cuda)]


@pytest.fixture(scope="module")
def eo():
    # Compiled Triton where a GPU is; the CPU paths never launch a Triton kernel.
    return kernel_sources.load_expert_offload(interpret=not HAS_CUDA)


def experts(seed: int) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return {"w13": torch.randint(-1, 2, (E, 2 * INTER, H), generator=gen).to(torch.bfloat16),
            "w2": torch.randint(-1, 2, (E, H, INTER), generator=gen).to(torch.bfloat16)}


def kernel(params: dict[str, torch.nn.Parameter]):
    """apply(x, ids, weights, first) over the tensors the parameters hold when called; -1 ids contribute nothing."""
    def apply(x: torch.Tensor, ids: torch.Tensor, w: torch.Tensor, first: bool) -> torch.Tensor:
        valid = ids >= 0
        idx = torch.where(valid, ids, torch.zeros_like(ids)).long()
        h = torch.einsum("nkoh,nh->nko", params["w13"].data[idx].double(), x.double())
        gate, up = h.split(INTER, dim=-1)
        y = torch.einsum("nkhi,nki->nkh", params["w2"].data[idx].double(), gate.relu() * up).to(x.dtype)
        gates = torch.where(valid, w.double(), torch.zeros_like(w, dtype=torch.float64))
        return (y.double() * gates.unsqueeze(-1)).sum(1).to(x.dtype)
    return apply


def routing(n_tokens: int, seed: int, device: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    x = torch.randint(-1, 2, (n_tokens, H), generator=gen).to(torch.bfloat16)
    ids = torch.stack([torch.randperm(E, generator=gen)[:TOP_K] for _ in range(n_tokens)]).to(torch.int32)
    w = torch.randint(1, 9, (n_tokens, TOP_K), generator=gen).float() / 8
    return x.to(device), ids.to(device), w.to(device)


class Pair:
    """One layer's experts twice: resident on the device, and offloaded by LayerOffload."""

    def __init__(self, eo, device: str, seed: int, masked: bool = False, prefetch: int = 0,
                 break_even: float = 0.0) -> None:
        host = experts(seed)
        self.resident = kernel({n: torch.nn.Parameter(t.to(device), requires_grad=False) for n, t in host.items()})
        self.params = {n: torch.nn.Parameter(t.clone(), requires_grad=False) for n, t in host.items()}
        self.hot = torch.randperm(E, generator=torch.Generator().manual_seed(seed + 100)).tolist()
        self.layer = eo.expert_offload.LayerOffload(self.params, self.hot, CACHE, STAGING, torch.device(device),
                                                    GROUPED_MIN_TOKENS, masked, f"layers.{seed}", prefetch,
                                                    break_even=break_even)
        self.offloaded = kernel(self.params)

    def forward(self, x: torch.Tensor, ids: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return self.layer.forward(x, ids, w, self.offloaded)

    def misses(self, ids: torch.Tensor) -> list[int]:
        return sorted(set(ids.flatten().tolist()) - set(self.hot[:CACHE]))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("path,masked", [("staged", False), ("direct", False), ("grouped", False),
                                         ("grouped", True)])
def test_each_path_equals_the_resident_layer(eo, device: str, path: str, masked: bool) -> None:
    pair = Pair(eo, device, seed=1, masked=masked)
    for seed in range(4):
        x, ids, w = routing(TOKENS[path], seed, device)
        assert pair.layer.path(*ids.shape) == path
        assert pair.misses(ids), "a step with no miss would not test the gather"
        assert torch.equal(pair.forward(x, ids, w), pair.resident(x, ids, w, True)), (path, masked, seed)
    assert pair.params["w13"].data.device.type == device  # the parameters hold the device buffer again


@pytest.mark.parametrize("masked", [False, True])
def test_the_cuda_skip_branch_forced_on_cpu(eo, masked: bool) -> None:
    """Grouped prefill's -1 ids (the branch CUDA takes; CPU kernels read -1 out of bounds, so there a skipped pick
    keeps a valid id at weight 0), forced on CPU against a kernel that honours -1: the same outputs."""
    pair = Pair(eo, "cpu", seed=3, masked=masked)
    pair.layer.skip_with_zero_weight = False
    seen: list[torch.Tensor] = []
    offloaded = pair.offloaded

    def recording(x, ids, w, first):  # noqa: ANN001, ANN202
        seen.append(ids.clone())
        return offloaded(x, ids, w, first)
    for seed in range(3):
        x, ids, w = routing(TOKENS["grouped"], seed, "cpu")
        out = pair.layer.forward(x, ids, w, recording)
        assert torch.equal(out, pair.resident(x, ids, w, True)), (masked, seed)
    assert any((ids < 0).any() for ids in seen), "no pass skipped a pick: the branch did not run"


@pytest.mark.parametrize("device", [pytest.param("cuda", marks=needs_cuda)])
def test_the_staged_path_replays_in_a_cuda_graph(eo, device: str) -> None:
    """One capture serves every routing: the remap and the gather read the step's ids on the device."""
    pair = Pair(eo, device, seed=2)
    x, ids, w = routing(TOKENS["staged"], 0, device)
    out = pair.forward(x, ids, w)  # warm-up outside the capture (Triton compiles here)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = pair.forward(x, ids, w)
    for seed in range(1, 6):
        nx, nids, nw = routing(TOKENS["staged"], seed, device)
        x.copy_(nx), ids.copy_(nids), w.copy_(nw)
        out.fill_(float("nan"))
        graph.replay()
        assert torch.equal(out, pair.resident(nx, nids, nw, True)), seed


def chain(eo, device: str, break_even: float) -> list[Pair]:
    pairs = [Pair(eo, device, seed=10 + i, prefetch=PREFETCH, break_even=break_even) for i in range(3)]
    eo.expert_prefetch.link([p.layer for p in pairs], torch.device(device))
    return pairs


def guess(pair: Pair, ids: torch.Tensor, right: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """The layer's prefetch list: its true misses (right) or uncached experts it does not pick, ascending."""
    picked = set(ids.flatten().tolist())
    pool = pair.misses(ids) if right else [e for e in pair.hot[CACHE:] if e not in picked]
    chosen = sorted(pool[:PREFETCH])
    listed = torch.full((PREFETCH,), -1, dtype=torch.int32)
    listed[:len(chosen)] = torch.tensor(chosen, dtype=torch.int32)
    return listed.to(ids.device), torch.tensor([len(chosen)], dtype=torch.int32, device=ids.device)


def hit_picks(inputs: list[tuple], lists: list[tuple]) -> int:
    """Picks of the layers after the first whose expert was guessed (the first layer's area is never filled)."""
    return sum(sum(e in set(listed.tolist()) for e in ids.flatten().tolist())
               for (_, ids, _), (listed, _) in zip(inputs[1:], lists[1:]))


def step(pairs: list[Pair], inputs: list[tuple], lists: list[tuple]) -> list[torch.Tensor]:
    """One decode step through the chain: before layer L runs, layer L+1 is told its guess (L gathers it)."""
    outs = []
    for i, (pair, (x, ids, w)) in enumerate(zip(pairs, inputs)):
        if i + 1 < len(pairs):
            pairs[i + 1].layer.prefetch.predict(*lists[i + 1])
        outs.append(pair.forward(x, ids, w))
    return outs


@pytest.mark.parametrize("device", DEVICES)
def test_prefetch_hits_and_outputs_eager(eo, device: str) -> None:
    """Right guesses are served from the prefetch area (the counters say so) with the resident layer's outputs;
    wrong ones gather nothing useful, and with the switch on the layers stop filling their areas."""
    for right, break_even in ((True, 0.0), (False, 0.0), (False, 0.3)):
        pairs = chain(eo, device, break_even)
        hits = 0
        for seed in range(4):
            inputs = [routing(TOKENS["staged"], 100 * seed + i, device) for i in range(len(pairs))]
            lists = [guess(p, ids, right) for p, (_, ids, _) in zip(pairs, inputs)]
            for pair, (x, ids, w), out in zip(pairs, inputs, step(pairs, inputs, lists)):
                assert torch.equal(out, pair.resident(x, ids, w, True)), (right, break_even, seed)
            if right:
                hits += hit_picks(inputs, lists)
        counted = eo.expert_prefetch.counters([p.layer for p in pairs])
        assert sum(c["hits"] for c in counted.values()) == hits
        off = sum(c["off_steps"] for c in counted.values())
        assert (off > 0) == (break_even > 0), (right, break_even, counted)


@pytest.mark.parametrize("device", [pytest.param("cuda", marks=needs_cuda)])
def test_prefetch_chain_replays_in_a_cuda_graph(eo, device: str) -> None:
    """The chain's step captured once (each layer's side-stream gather of the next one's guess inside it) and
    replayed on new routings and guesses: the outputs equal the resident layers' and every right guess is a hit."""
    pairs = chain(eo, device, 0.3)
    inputs = [routing(TOKENS["staged"], i, device) for i in range(len(pairs))]
    lists = [guess(p, ids, True) for p, (_, ids, _) in zip(pairs, inputs)]
    outs = step(pairs, inputs, lists)  # warm-up outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        outs = step(pairs, inputs, lists)
    for layer in pairs:
        layer.layer.prefetch.restart()
    hits = 0
    for seed in range(1, 6):
        new = [routing(TOKENS["staged"], 100 * seed + i, device) for i in range(len(pairs))]
        for static, fresh in zip(inputs, new):
            for a, b in zip(static, fresh):
                a.copy_(b)
        fresh_lists = [guess(pair, ids, True) for pair, (_, ids, _) in zip(pairs, new)]
        for static, fresh in zip(lists, fresh_lists):
            for a, b in zip(static, fresh):
                a.copy_(b)
        graph.replay()
        for pair, (x, ids, w), out in zip(pairs, new, outs):
            assert torch.equal(out, pair.resident(x, ids, w, True)), seed
        hits += hit_picks(new, fresh_lists)
    assert sum(c["hits"] for c in eo.expert_prefetch.counters([p.layer for p in pairs]).values()) == hits


@pytest.mark.parametrize("device", DEVICES)
def test_the_layers_share_one_staging_region_and_free_it(eo, device: str) -> None:
    """Issue 40 item 3: a row written through one layer's staging is read through the other's, their cache rows
    stay apart, and (CUDA) the mapped memory goes back to the driver when the layers go."""
    import gc

    def free() -> int:
        gc.collect()
        return torch.cuda.mem_get_info()[0] if device == "cuda" else 0
    before = free()
    pairs = [Pair(eo, device, seed=20 + i) for i in range(2)]
    assert all(p.layer.shared_staging for p in pairs)
    for name in ("w13", "w2"):
        a, b = (p.layer.buf[name] for p in pairs)
        a[CACHE].fill_(7)
        assert torch.equal(b[CACHE], a[CACHE])
        a[0].fill_(9)
        assert not torch.equal(b[0], a[0])
    x, ids, w = routing(TOKENS["staged"], 0, device)
    assert torch.equal(pairs[1].forward(x, ids, w), pairs[1].resident(x, ids, w, True))
    del pairs, a, b
    if device == "cuda":
        assert free() >= before - (4 << 20), "the mapped staging and cache memory was not given back"
