"""GPU benchmarks of the stack's kernels, for a GPU host: they import only torch and triton (the kernel modules come
from the patch stack through kernel_sources.py, without vLLM), print what they measure as they measure it, and
nothing of the rest of rigstack imports them. Their commands are scripts/bench_*.py; tests/kernels tests the kernels.

    kernel_sources.py   the stack's torch/triton modules loaded by file path (from vllm, or from the patches)
    graph_timing.py     timing a captured CUDA graph by CUDA events
    sparse_mla.py       patch 0009's sparse MLA decode and patch 0010's indexer logits   scripts/bench_sparse_mla.py
    expert_gather.py    patch 0013's miss gather against a contiguous copy              scripts/bench_expert_gather.py
    cond_copy.py        copy-engine gathers chosen on the GPU by conditional graph nodes (for expert_gather.py)
    cond_copy_probe.py  does a conditional node's memcpy use the copy engine?  python -m rigstack.bench.cond_copy_probe
    expert_prefill.py   patch 0014's grouped against masked prefill                     scripts/bench_expert_prefill.py
    moe_layer.py        one offloaded MoE layer with a hot-expert cache                  scripts/bench_moe_layer.py
"""
