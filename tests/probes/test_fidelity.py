"""The fidelity gate's rule on known samples: tokens exact, logprobs within the baseline's own spread."""

from __future__ import annotations

import pytest

from rigstack.errors import UserError
from rigstack.probes.fidelity import gate
from testing.probes import make_result

PARAMS = {"max_tokens": 3, "prompt_sha256": ["abc"]}


def _bang(*runs: tuple[list[int], list[float]], params: dict | None = None):
    samples = [{"prompt": 0, "run": i, "token_ids": ids, "logprobs": lps} for i, (ids, lps) in enumerate(runs)]
    return make_result(kind="bang", samples=samples, params=params or PARAMS)


BASE = _bang(([1, 2, 3], [-0.5, -1.0, -0.25]), ([1, 2, 3], [-0.5, -1.002, -0.25]))  # spread 2e-3


def test_within_spread_passes() -> None:
    verdict = gate(BASE, _bang(([1, 2, 3], [-0.501, -1.0, -0.25])))
    assert verdict.passed and verdict.spread == pytest.approx(2e-3) and verdict.tokens_compared == 3


def test_logprob_beyond_spread_fails() -> None:
    verdict = gate(BASE, _bang(([1, 2, 3], [-0.5, -1.0, -0.253])))
    assert not verdict.passed
    assert verdict.problems == ["prompt 0 run 0: logprob differs by 0.003 > 0.002"]


def test_token_difference_fails_at_its_position() -> None:
    verdict = gate(BASE, _bang(([1, 2, 4], [-0.5, -1.0, -0.25])))
    assert verdict.problems == ["prompt 0 run 0: tokens differ from the baseline at position 2"]


def test_bit_identical_baseline_uses_the_floor() -> None:
    exact = _bang(([1, 2], [-0.5, -1.0]), ([1, 2], [-0.5, -1.0]))
    assert gate(exact, _bang(([1, 2], [-0.5, -1.0]))).passed
    assert not gate(exact, _bang(([1, 2], [-0.5, -1.00001]))).passed


def test_baseline_needs_two_runs_and_the_same_prompts() -> None:
    with pytest.raises(UserError, match="one run per prompt"):
        gate(_bang(([1], [-0.5])), BASE)
    with pytest.raises(UserError, match="different max_tokens"):
        gate(BASE, _bang(([1, 2, 3], [-0.5, -1.0, -0.25]), params={**PARAMS, "max_tokens": 4}))
