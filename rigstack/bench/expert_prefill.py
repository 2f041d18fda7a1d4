"""Benchmark: grouped against masked prefill of one offloaded MoE layer (patch 0014), time and equality, on a GPU.

One layer of the seed's shape: 288 experts, top-8, 66 hot experts in the GPU cache and 64 staging slots, every
expert in pinned host memory (bf16, hidden 2048, intermediate 1024: 12.6 MB an expert, the seed's NVFP4 experts
are 13.5 MB). Routing: Zipf within the layer (the hottest 35% take about 74% of the picks, as in the seed), the
hot set the layer's top 66. For 14, 48, 512 and 8,192-token prompts it times, in one run and in turn:
- all resident: the same experts all on the GPU, one MoE call (the reference);
- grouped: the cache hits, then the 222 offloaded experts in groups of 64 (each group's experts all gathered);
- masked: the same groups, gathering only the experts the prompt picks (VLLM_EXPERT_OFFLOAD_MASKED=1);
- direct (up to 48 tokens, the path below the grouping threshold): one MoE call reading the host copy in place.
The MoE computation is a torch one (no vLLM here): per pick its expert's SwiGLU output times the weight, summed
over the picks in pick order, as vLLM's fused MoE sums its top-k. It reports milliseconds (median of the rounds),
whether grouped and masked are bit for bit equal, and their largest difference from all resident.
The module under test is read from the patch stack (tests/kernels/kernel_sources.py): torch and triton only.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

from rigstack.bench import kernel_sources
import torch

N_EXPERTS, TOP_K, CACHE, STAGING = 288, 8, 66, 64
HIDDEN, INTER = 2048, 1024
ZIPF = 1.1  # hottest 35% of 288 take ~74% (rigstack.offload_model.zipf_exponent gives 1.08)


def moe(x: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor, ids: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """SwiGLU experts, -1 ids skipped; each pick's output in a [T, K, H] buffer, summed over K (fixed order)."""
    t, k = ids.shape
    pairs = torch.zeros(t * k, x.shape[1], dtype=torch.float32, device=x.device)
    flat, weights = ids.reshape(-1), w.reshape(-1)
    for s in torch.unique(flat[flat >= 0]).tolist():
        rows = (flat == s).nonzero().squeeze(1)
        h = x[rows // k] @ w13[s].T
        gate, up = h.chunk(2, dim=-1)
        pairs[rows] = ((torch.nn.functional.silu(gate) * up) @ w2[s].T).float() * weights[rows, None]
    return pairs.view(t, k, -1).sum(1).to(x.dtype)


def _variant(name: str, layers: dict, resident: tuple[torch.Tensor, torch.Tensor], x: torch.Tensor,
             ids: torch.Tensor, w: torch.Tensor) -> Callable[[], torch.Tensor]:
    """One timed variant as a call: all resident, grouped or masked prefill, or the direct host reads."""
    if name == "resident":
        return lambda: moe(x, *resident, ids, w)
    layer, params = layers[name == "masked"]

    def apply(xx: torch.Tensor, i: torch.Tensor, ww: torch.Tensor, first: bool) -> torch.Tensor:
        return moe(xx, params["w13"].data, params["w2"].data, i, ww)

    def direct() -> torch.Tensor:
        with layer._on_host():
            return apply(x, ids, w, True)

    return direct if name == "direct" else lambda: layer._grouped(x, ids, w, apply)


def run(sizes: list[int], rounds: int) -> int:
    mod = kernel_sources.load_expert_offload(interpret=False).expert_offload
    dev = torch.device("cuda")
    gen = torch.Generator(device="cpu").manual_seed(0)
    w13 = (torch.randn(N_EXPERTS, 2 * INTER, HIDDEN, generator=gen) * 0.02).to(torch.bfloat16)
    w2 = (torch.randn(N_EXPERTS, HIDDEN, INTER, generator=gen) * 0.02).to(torch.bfloat16)
    resident = (w13.to(dev), w2.to(dev))
    heat = torch.arange(1, N_EXPERTS + 1, dtype=torch.float64) ** -ZIPF
    perm = torch.randperm(N_EXPERTS, generator=gen)
    probs = torch.empty(N_EXPERTS, dtype=torch.float64)
    probs[perm] = heat  # expert perm[r] has rank r
    hot = perm[:CACHE].tolist()
    layers = {}
    for masked in (False, True):
        params = {"w13": torch.nn.Parameter(w13.clone(), requires_grad=False),
                  "w2": torch.nn.Parameter(w2.clone(), requires_grad=False)}
        layers[masked] = (mod.LayerOffload(params, hot, CACHE, STAGING, dev, 1, masked, "bench"), params)
    print(f"one layer: {N_EXPERTS} experts, top-{TOP_K}, {CACHE} cached, {STAGING} staging, "
          f"{layers[False][0].n_groups} groups; {w13[0].numel() * 3 / 1e6:.1f} MB an expert; "
          f"{torch.cuda.get_device_name()}")
    print(f"{'tokens':>7} {'resident ms':>12} {'grouped ms':>11} {'masked ms':>10} {'direct ms':>10} "
          f"{'distinct':>9} {'masked==grouped':>16} {'max |grouped-resident|':>23}")
    for n in sizes:
        x = torch.randn(n, HIDDEN, generator=gen).to(torch.bfloat16).to(dev)
        ids = torch.multinomial(probs.expand(n, -1), TOP_K, generator=gen).to(torch.int32).to(dev)
        w = torch.rand(n, TOP_K, generator=gen).to(dev)
        w = w / w.sum(-1, keepdim=True)

        names = ["resident", "grouped", "masked"] + (["direct"] if n <= 48 else [])
        times: dict[str, list[float]] = {name: [] for name in names}
        outs = {}
        for name in names:  # warm-up, and the outputs compared
            outs[name] = _variant(name, layers, resident, x, ids, w)()
        for _ in range(rounds):
            for name in names:
                fn = _variant(name, layers, resident, x, ids, w)
                torch.cuda.synchronize()
                start = time.perf_counter()
                fn()
                torch.cuda.synchronize()
                times[name].append((time.perf_counter() - start) * 1e3)
        med = {name: statistics.median(v) for name, v in times.items()}
        equal = torch.equal(outs["grouped"], outs["masked"])
        diff = (outs["grouped"].float() - outs["resident"].float()).abs().max().item()
        direct = f"{med['direct']:10.2f}" if "direct" in med else f"{'-':>10}"
        distinct = torch.unique(ids).numel()
        print(f"{n:7d} {med['resident']:12.2f} {med['grouped']:11.2f} {med['masked']:10.2f} {direct} "
              f"{distinct:9d} {equal!s:>16} {diff:23.3g}")
        if "direct" in outs:
            print(f"{'':7} direct == resident: {torch.equal(outs['direct'], outs['resident'])}")
    return 0
