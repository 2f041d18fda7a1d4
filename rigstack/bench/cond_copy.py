"""Copy-engine expert gathers driven from the GPU by CUDA graph conditional nodes, for the gather benchmark.

A memcpy node's source, destination and size are fixed when it is added, so the GPU can only choose WHICH copies
run: one tiny kernel reads the step's miss list and count on the device and sets the conditional handles
(``cudaGraphSetConditional``, callable only from device code, hence NVRTC), then the conditional nodes run their
fixed copies. Two layouts (the timing, the node counts and why neither reaches 0.95 are in tests/kernels/README.md):
- ``switch``: per staging slot s a SWITCH node with one branch per expert (branch e copies host[e] -> staging[s]),
  value miss_list[s], or out of range (no branch) for s >= count: the module's ``gather_misses`` semantics, at
  slots x experts memcpy nodes a step;
- ``if``: per expert an IF node copying host[e] -> landing[e] when e is in the list: one node per expert, but a
  landing slot per expert instead of a staging slot per miss.
The nodes form ``chains`` parallel chains (node i on chain i % chains), so one copy's launch latency can hide
behind another chain's transfer. Needs cuda-python's ``cuda.bindings`` (13 or newer) and NVRTC; ``unavailable()``
says why not. The nodes are inserted into the torch CUDA-graph capture in progress (``torch.cuda.graph``).
"""

from __future__ import annotations

import numpy as np
import torch

_HANDLES = 448  # handles a set kernel takes by value (3.5 KiB, inside the 4 KiB of classic kernel parameters)

_SOURCE = r"""
typedef __device_builtin__ unsigned long long cudaGraphConditionalHandle;
extern "C" __device__ __cudart_builtin__ void cudaGraphSetConditional(cudaGraphConditionalHandle handle,
                                                                      unsigned int value);
// By value: the handles exist only once the capture has begun, and the kernel's parameters are fixed then too.
struct Handles { cudaGraphConditionalHandle v[N_HANDLES]; };
// SWITCH per staging slot: slot s takes branch list[s] (its expert), or none (value n_experts) at s >= count.
extern "C" __global__ void set_switch(Handles h, const int* list, const int* count, int n_slots, int n_experts) {
    int s = blockIdx.x * blockDim.x + threadIdx.x;
    if (s >= n_slots) return;
    int e = s < *count ? list[s] : -1;
    cudaGraphSetConditional(h.v[s], (e >= 0 && e < n_experts) ? (unsigned)e : (unsigned)n_experts);
}
// IF per expert: expert e's copy runs when e is in list[:count].
extern "C" __global__ void set_if(Handles h, const int* list, const int* count, int n_slots, int n_experts) {
    int e = blockIdx.x * blockDim.x + threadIdx.x;
    if (e >= n_experts) return;
    int c = min(*count, n_slots);
    unsigned v = 0;
    for (int s = 0; s < c; ++s) v |= (list[s] == e);
    cudaGraphSetConditional(h.v[e], v);
}
""".replace("N_HANDLES", str(_HANDLES))


def _ok(result):
    """The values of a cuda.bindings call, or a RuntimeError naming its error code."""
    err, *values = result if isinstance(result, tuple) else (result,)
    if int(err) != 0:
        raise RuntimeError(f"CUDA call failed: {err!r}")
    return values[0] if len(values) == 1 else tuple(values)


def unavailable() -> str | None:
    """Why conditional-node gathers cannot be built here, or None."""
    try:
        from cuda.bindings import __version__
    except ImportError as exc:
        return f"no cuda.bindings ({exc})"
    if int(__version__.split(".")[0]) < 13:
        return f"cuda.bindings {__version__} is older than 13"
    return None


class CondGather:
    """Builds conditional-node gathers into the capture in progress on torch's current stream."""

    def __init__(self) -> None:
        from cuda.bindings import driver, nvrtc, runtime
        self.driver, self.runtime = driver, runtime
        torch.empty(1, device="cuda")  # the primary context, current on this thread
        major, minor = torch.cuda.get_device_capability()
        prog = _ok(nvrtc.nvrtcCreateProgram(_SOURCE.encode(), b"cond_copy.cu", 0, [], []))
        opts = [f"--gpu-architecture=compute_{major}{minor}".encode()]
        if int(nvrtc.nvrtcCompileProgram(prog, len(opts), opts)[0]):
            log = b" " * _ok(nvrtc.nvrtcGetProgramLogSize(prog))
            nvrtc.nvrtcGetProgramLog(prog, log)
            raise RuntimeError(f"NVRTC: {log.decode()}")
        ptx = b" " * _ok(nvrtc.nvrtcGetPTXSize(prog))
        _ok(nvrtc.nvrtcGetPTX(prog, ptx))
        _ok(nvrtc.nvrtcDestroyProgram(prog))
        self._ptx = np.frombuffer(ptx, dtype=np.uint8).copy()
        self._module = _ok(driver.cuModuleLoadData(self._ptx.ctypes.data))
        self._kernels = {k: _ok(driver.cuModuleGetFunction(self._module, f"set_{k}".encode()))
                         for k in ("switch", "if")}
        self._ctx = _ok(driver.cuCtxGetCurrent())
        self._keep: list = []  # kernel arguments and node parameters, alive as long as this object
        self.memcpy_nodes = 0
        self.cond_nodes = 0

    def _set_handles(self, mode: str, handles: list, miss_list: torch.Tensor, miss_count: torch.Tensor,
                     n_experts: int, stream: int) -> None:
        h = np.zeros(_HANDLES, dtype=np.uint64)
        h[:len(handles)] = [int(x) for x in handles]
        args = [h, np.array([miss_list.data_ptr()], np.uint64), np.array([miss_count.data_ptr()], np.uint64),
                np.array([miss_list.numel()], np.int32), np.array([n_experts], np.int32)]
        ptrs = np.array([a.ctypes.data for a in args], dtype=np.uint64)
        self._keep.append((args, ptrs))
        blocks = -(-len(handles) // 128)
        _ok(self.driver.cuLaunchKernel(self._kernels[mode], blocks, 1, 1, 128, 1, 1, 0, stream, ptrs.ctypes.data, 0))

    def gather(self, mode: str, src: torch.Tensor, miss_list: torch.Tensor, miss_count: torch.Tensor,
               dst: torch.Tensor, chains: int = 1) -> None:
        """Capture one step. ``switch``: dst[s] = src[miss_list[s]] for s < count, dst [S, ...] staging;
        ``if``: dst[e] = src[e] for e in miss_list[:count], dst [E, ...] a landing slot per expert."""
        r, d = self.runtime, self.driver
        n_experts = src.shape[0]
        n_cond = dst.shape[0] if mode == "switch" else n_experts
        if n_cond > _HANDLES or (mode == "if" and dst.shape[0] != n_experts):
            raise ValueError(f"{mode}: {n_cond} conditional nodes (at most {_HANDLES}), landing rows {dst.shape[0]}")
        stream = torch.cuda.current_stream().cuda_stream
        graph = _ok(r.cudaStreamGetCaptureInfo(stream))[2]
        handles = [_ok(r.cudaGraphConditionalHandleCreate(graph, 0, 0)) for _ in range(n_cond)]
        self._set_handles(mode, handles, miss_list, miss_count, n_experts, stream)
        info = _ok(r.cudaStreamGetCaptureInfo(stream))
        graph, start = info[2], list(info[3])
        row = src[0].numel() * src.element_size()
        tails = [start] * chains
        kind = d.CUgraphConditionalNodeType.CU_GRAPH_COND_TYPE_SWITCH if mode == "switch" else \
            d.CUgraphConditionalNodeType.CU_GRAPH_COND_TYPE_IF
        for i in range(n_cond):
            p = d.CUgraphNodeParams()
            p.type = d.CUgraphNodeType.CU_GRAPH_NODE_TYPE_CONDITIONAL
            p.conditional.handle = handles[i]
            p.conditional.type = kind
            p.conditional.size = n_experts if mode == "switch" else 1
            p.conditional.ctx = self._ctx
            deps = tails[i % chains]
            node = _ok(d.cuGraphAddNode(graph, deps, None, len(deps), p))
            self._keep.append(p)
            # Branch e of slot i's SWITCH copies expert e into slot i; expert i's IF copies it into landing row i.
            pairs = enumerate(p.conditional.phGraph_out) if mode == "switch" else [(i, p.conditional.phGraph_out[0])]
            for e, body in pairs:
                _ok(r.cudaGraphAddMemcpyNode1D(body, None, 0, dst.data_ptr() + i * row, src.data_ptr() + e * row,
                                               row, r.cudaMemcpyKind.cudaMemcpyDefault))
                self.memcpy_nodes += 1
            self.cond_nodes += 1
            tails[i % chains] = [node]
        ends = [t[0] for t in tails if t is not start]
        _ok(r.cudaStreamUpdateCaptureDependencies(
            stream, ends, None, len(ends), r.cudaStreamUpdateCaptureDependenciesFlags.cudaStreamSetCaptureDependencies))
