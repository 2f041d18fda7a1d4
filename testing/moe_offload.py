"""Patch 0014's tiny offloaded MoE layer on CPU (its tests and 0019's): prepacked bf16 weights of 8 experts, vLLM's CPU
fused MoE over whatever tensors the layer's parameters hold, seeded routes, and the offload's settings from its
environment switches."""

from __future__ import annotations

import torch


E, H, INTER, K = 8, 256, 128, 2  # the tiny MoE model's layer: 8 experts, top-2
HOT = [5, 1, 7, 0, 2]  # hottest first
ISA = "vec"


def prepacked(dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    from vllm import _cpu_ops as ops

    gen = torch.Generator().manual_seed(0)
    w13 = (torch.randn(E, 2 * INTER, H, generator=gen) * 0.1).to(dtype)
    w2 = (torch.randn(E, H, INTER, generator=gen) * 0.1).to(dtype)
    return ops.cpu_prepack_moe_weight(w13, ISA), ops.cpu_prepack_moe_weight(w2, ISA)


def kernel(w13: torch.Tensor, w2: torch.Tensor, calls: list[torch.Tensor] | None = None):
    """vLLM's CPU fused MoE over whatever tensors w13/w2 hold when it is called (the layer's parameters)."""
    from vllm import _cpu_ops as ops

    def apply(x: torch.Tensor, ids: torch.Tensor, w: torch.Tensor, first: bool) -> torch.Tensor:
        if calls is not None:
            calls.append(ids.clone())
        out = torch.empty(x.shape[0], H, dtype=x.dtype)
        ops.cpu_fused_moe(out, x, w13.data, w2.data, None, None, w.contiguous(), ids.contiguous(), "silu", ISA)
        return out
    return apply


def route(n_tokens: int, seed: int, top_k: int = K,
           dtype: torch.dtype = torch.bfloat16) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(n_tokens, H, generator=gen).to(dtype)
    w, ids = torch.topk(torch.randn(n_tokens, E, generator=gen).softmax(-1), top_k)
    return x, (w / w.sum(-1, keepdim=True)).float(), ids.int()


def resident_output(weights, x, w, ids) -> torch.Tensor:
    return kernel(*weights)(x, ids, w, True)


def offload_settings(eo, monkeypatch, **env: str):
    for name in ("VLLM_EXPERT_OFFLOAD_CACHE", "VLLM_EXPERT_OFFLOAD_BUDGET_GIB"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("VLLM_EXPERT_OFFLOAD", "/nonexistent/hot.json")
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    return eo.settings_from_env()
