"""cond_copy.py, the gather benchmark's copy-engine gathers chosen on the GPU by CUDA graph conditional nodes.

GPU tests (marker gpu; they skip without a CUDA GPU or cuda.bindings): each layout, captured once, staged bit for
bit on every replay as its miss list and count in device memory change, wrote nothing at a count of 0, and a
memcpy in a conditional body is the SM kernel the benchmark's figures blame (tests/kernels/README.md).
"""

from __future__ import annotations

import pytest
import torch

from rigstack.bench import cond_copy

_WHY = None if torch.cuda.is_available() else "needs a CUDA GPU"
_WHY = _WHY or cond_copy.unavailable()
needs = pytest.mark.skipif(_WHY is not None, reason=f"conditional-node gathers: {_WHY}")
N_EXPERTS, STAGING, ROW = 40, 8, 4096
LISTS = ([39, 0, 17, 5, -1, -1, -1, -1], [-1] * 8, list(range(30, 38)), [3, -1, -1, -1, -1, -1, -1, -1])


def _graph(builder, mode: str, host, d_list, d_count, dst, chains: int) -> torch.cuda.CUDAGraph:
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        builder.gather(mode, host, d_list, d_count, dst, chains=chains)
    return graph


@pytest.mark.gpu
@needs
@pytest.mark.parametrize("mode,chains", [("switch", 1), ("switch", 3), ("if", 1), ("if", 3)])
def test_conditional_gather_stages_each_replays_list(mode, chains):
    host = torch.randint(0, 256, (N_EXPERTS, ROW), dtype=torch.uint8).pin_memory()
    builder = cond_copy.CondGather()
    d_list = torch.full((STAGING,), -1, dtype=torch.int32, device="cuda")
    d_count = torch.zeros(1, dtype=torch.int32, device="cuda")
    dst = torch.zeros((STAGING if mode == "switch" else N_EXPERTS, ROW), dtype=torch.uint8, device="cuda")
    graph = _graph(builder, mode, host, d_list, d_count, dst, chains)
    for values in LISTS:
        lst = torch.tensor(values, dtype=torch.int32)
        count = int((lst >= 0).sum())
        d_list.copy_(lst)
        d_count.fill_(count)
        dst.zero_()
        graph.replay()
        torch.cuda.synchronize()
        want = torch.zeros(dst.shape, dtype=torch.uint8)
        listed = lst[:count].long()
        if mode == "switch":
            want[:count] = host[listed]
        else:
            want[listed] = host[listed]
        assert torch.equal(dst.cpu(), want), (mode, chains, values)


@pytest.mark.gpu
@needs
def test_memcpy_in_a_conditional_body_runs_as_a_kernel():
    """The profiler names a plain memcpy node a copy, and the same memcpy inside an IF body a kernel."""
    host = torch.randint(0, 256, (1, 1 << 20), dtype=torch.uint8).pin_memory()
    dst = torch.zeros((1, 1 << 20), dtype=torch.uint8, device="cuda")
    first = torch.zeros(1, dtype=torch.int32, device="cuda")
    one = torch.ones(1, dtype=torch.int32, device="cuda")
    plain = torch.cuda.CUDAGraph()
    with torch.cuda.graph(plain):
        dst.copy_(host, non_blocking=True)
    cond = _graph(cond_copy.CondGather(), "if", host, first, one, dst, 1)
    names = {}
    for name, graph in (("plain", plain), ("if", cond)):
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            graph.replay()
            torch.cuda.synchronize()
        names[name] = {e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA}
        assert torch.equal(dst.cpu(), host)
    assert any(n.startswith("Memcpy HtoD") for n in names["plain"]), names
    assert not any(n.startswith("Memcpy") for n in names["if"]) and "set_if" in names["if"], names
    assert names["if"] - {"set_if"}, names  # the copy itself, as a kernel (the driver's "memcpy128" on 580.159)
