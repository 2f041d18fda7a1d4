"""Patch 0007's canonical decode top-k, by brute force, and the tied scores that make it matter (shared by the CPU
tests in tests/patches and the GPU tests in tests/kernels)."""

from __future__ import annotations

import torch


def canonical_topk(logits: torch.Tensor, row_ends: list[int], counts: list[int], k: int) -> torch.Tensor:
    """Each row: the `count` best columns below its end, ties to the lower column, ascending, then -1 up to k."""
    out = []
    for row, (end, count) in enumerate(zip(row_ends, counts)):
        ranked = sorted(range(end), key=lambda c: (-float(logits[row, c]), c))
        chosen = sorted(ranked[:count])
        out.append(chosen + [-1] * (k - len(chosen)))
    return torch.tensor(out, dtype=torch.int32)


def tied_logits(rows: int, width: int, seed: int) -> torch.Tensor:
    """Scores of a few distinct values, so many ties straddle the top-k cut."""
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(0, 4, (rows, width), generator=gen).to(torch.float32)
