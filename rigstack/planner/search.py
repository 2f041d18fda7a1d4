"""The partition search: for the request's PP size, the contiguous split of the layers that maximises the pool."""

from __future__ import annotations

from dataclasses import replace
from itertools import accumulate

from rigstack.planner.core import GIB, RESERVE, Plan, Request, Reserve, plan
from rigstack.planner.verdict import judge


def search(request: Request, reserve: Reserve = RESERVE) -> Plan:
    """The partition that maximises the pool for the request's PP size. One plan with a stage per layer gives each
    layer's weight bytes and KV bytes per block (the block pool's bytes add up over a stage's layers); the largest
    block count every stage can reach is then found by bisection, each stage taking as many layers as still reach
    it (optimal for a bottleneck over contiguous ranges, since a stage's blocks only fall as it grows), and the
    result is planned in full. No stage takes more layers than the given partition's longest (a pipeline's
    throughput follows its slowest stage, so the search trades none of it for KV). The stack asks nothing else of
    stage boundaries (the DFlash2 aux relay, patch 0006, captures an aux layer on either side of a boundary)."""
    probe = plan(request, reserve)
    layers, pp, longest = sum(probe.partition), probe.pp, max(probe.partition)
    singles = plan(replace(request, pp=layers, partition=(1,) * layers), reserve).stages
    budget = singles[0].available_gib + singles[0].weights_gib  # GiB for weights and KV, the reserve taken off
    weight = [0.0, *accumulate(stage.weights_gib for stage in singles)]
    page = [0, *accumulate(stage.bytes_per_block for stage in singles)]

    def blocks(first: int, end: int) -> int:
        return max(0, int((budget - weight[end] + weight[first]) * GIB)) // (page[end] - page[first])

    def split(target: int) -> list[int] | None:
        parts, first = [], 0
        for stage in range(pp):
            end = first + 1
            if stage == pp - 1:
                end = layers
            else:
                while (end < layers - (pp - 1 - stage) and end - first < longest
                       and blocks(first, end + 1) >= target):
                    end += 1
            if blocks(first, end) < target or end - first > longest:
                return None
            parts.append(end - first)
            first = end
        return parts

    low, high = 0, max(stage.blocks for stage in singles)
    while low < high:
        middle = (low + high + 1) // 2
        low, high = (middle, high) if split(middle) else (low, middle - 1)
    found = plan(replace(request, partition=tuple(split(low) or probe.partition)), reserve)
    # With a drafter group on the last stage the bisection is a heuristic: never worse than the given partition,
    # and the given one where the two hold the same.
    return max((probe, found), key=lambda candidate: (candidate.starts, candidate.pool_tokens))


def longest_start(request: Request, probe: Plan, reserve: Reserve = RESERVE) -> int | None:
    """The longest max-model-len, in whole blocks, at which the request's plan (`probe`, already made) `starts` (its
    margin past the error bar), found by bisection with full plans, since the KV budget itself moves with
    max-model-len (workspaces sized by it); None if not even one block does."""
    block = probe.block_size

    def starts(blocks: int) -> bool:
        return judge(plan(replace(request, max_model_len=blocks * block), reserve)).value == "starts"

    low, high = 0, probe.max_model_len // block
    while low < high:
        middle = (low + high + 1) // 2
        low, high = (middle, high) if starts(middle) else (low, middle - 1)
    return low * block or None
