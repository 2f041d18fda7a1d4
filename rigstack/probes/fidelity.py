"""The fidelity gate (seed 000's criterion): a candidate server must give the same greedy tokens as the baseline,
and logprobs within the baseline's own run-to-run spread.

Both sides are corruption-probe results (probe_bang.py, several prompts x several greedy runs, token ids and
logprobs kept as samples). Tokens are compared exactly; logprobs only to the spread, because a different parallel
layout legitimately moves them by a few 1e-3 while a healthy server repeats itself to the bit.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

from rigstack.errors import UserError
from rigstack.probes.bang import first_difference
from rigstack.probes.results import Result

# The smallest tolerance: float32 rounding noise, far below the ~1e-3 changes a real numeric change makes.
DEFAULT_FLOOR = 1e-6


@dataclass(frozen=True)
class Fidelity:
    passed: bool
    spread: float  # baseline's own largest run-to-run logprob difference
    tolerance: float
    max_logprob_diff: float
    tokens_compared: int
    problems: list[str] = field(default_factory=list)

    def summary(self) -> str:
        head = "fidelity PASS" if self.passed else "fidelity FAIL"
        return (f"{head}: {self.tokens_compared} tokens compared, max logprob difference {self.max_logprob_diff:.3g} "
                f"(tolerance {self.tolerance:.3g} = baseline spread {self.spread:.3g} or the floor)"
                + (f"; {self.problems[0]}" if self.problems else ""))


def _runs(result: Result, side: str) -> dict[int, list[dict]]:
    if result.kind != "bang" or not result.samples:
        raise UserError(f"{side} is a {result.kind!r} result without samples; the fidelity gate compares "
                        "`python scripts/probe_bang.py --out FILE` results")
    runs: dict[int, list[dict]] = defaultdict(list)
    for sample in sorted(result.samples, key=lambda s: (s["prompt"], s["run"])):
        runs[sample["prompt"]].append(sample)
    return runs


def _max_diff(a: list[float], b: list[float]) -> float:
    return max((abs(x - y) for x, y in zip(a, b)), default=0.0)


def comparable(baseline: Result, candidate: Result) -> None:
    keys = ("max_tokens", "prompt_sha256")
    mismatched = [k for k in keys if baseline.provenance.params.get(k) != candidate.provenance.params.get(k)]
    if mismatched:
        raise UserError(f"the two probe results used different {', '.join(mismatched)}; rerun both with the same "
                        "--prompt and --max-tokens")


def gate(baseline: Result, candidate: Result, floor: float = DEFAULT_FLOOR) -> Fidelity:
    comparable(baseline, candidate)
    base, cand = _runs(baseline, "the baseline"), _runs(candidate, "the candidate")
    if min(len(runs) for runs in base.values()) < 2:
        raise UserError("the baseline has one run per prompt, so no run-to-run spread; rerun it with --repeats 2")
    problems: list[str] = []
    spread = 0.0
    for prompt, runs in base.items():
        reference = runs[0]
        for run in runs[1:]:
            position = first_difference(reference["token_ids"], run["token_ids"])
            if position is not None:
                problems.append(f"baseline itself is not reproducible: prompt {prompt} run {run['run']} differs at "
                                f"position {position}")
            spread = max(spread, _max_diff(reference["logprobs"], run["logprobs"]))
    tolerance = max(spread, floor)
    worst, compared = 0.0, 0
    for prompt, reference in ((p, runs[0]) for p, runs in base.items()):
        if prompt not in cand:
            problems.append(f"candidate has no runs for prompt {prompt}")
            continue
        for run in cand[prompt]:
            position = first_difference(reference["token_ids"], run["token_ids"])
            if position is not None:
                problems.append(f"prompt {prompt} run {run['run']}: tokens differ from the baseline at position "
                                f"{position}")
            common = len(reference["token_ids"]) if position is None else position
            compared += common
            diff = _max_diff(reference["logprobs"][:common], run["logprobs"][:common])
            if diff > tolerance:
                problems.append(f"prompt {prompt} run {run['run']}: logprob differs by {diff:.3g} > {tolerance:.3g}")
            worst = max(worst, diff)
    return Fidelity(passed=not problems, spread=spread, tolerance=tolerance, max_logprob_diff=worst,
                    tokens_compared=compared, problems=problems)
