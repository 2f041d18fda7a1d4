"""Usable capacity (rigstack/planner/usable.py, issue 38 item 5) on real plans: pool tokens beyond max-num-seqs
requests are KV no request reaches while prefix caching is off, and the advice, planned, uses them."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from rigstack.planner.profile_plan import plan_for


def test_a_pool_past_max_num_seqs_requests_is_unreachable_and_the_advice_uses_it(tmp_path: Path) -> None:
    # Seed 002's eight cards as shipped: 1M context, 8 sequences, prefix caching off.
    shipped = plan_for("cmp170hx-8x-pp8")
    use = shipped["usable"]
    assert use["sessions"] == pytest.approx(shipped["sessions"]) and use["sessions"] > 8 == use["admitted"]
    share = 1 - 8 / use["sessions"]
    binding = shipped["stages"][shipped["binding_stage"]]
    assert use["unreachable_gib"] == pytest.approx(binding["pool_gib"] * share)
    assert use["unreachable_tokens"] == int(shipped["pool_tokens"] * share)
    seqs = int(re.search(r"max-num-seqs (\d+)", use["advice"]).group(1))
    assert seqs == int(use["sessions"])
    wider = plan_for("cmp170hx-8x-pp8", max_num_seqs=seqs)["usable"]
    assert wider["admitted"] == seqs and wider["unreachable_gib"] < use["unreachable_gib"] / 4
    cached = tmp_path / "cached.yaml"
    cached.write_text("extends: cmp170hx-8x-pp8\nvllm:\n  enable-prefix-caching: true\n")
    assert plan_for(str(cached))["usable"]["unreachable_gib"] == 0  # cached prefixes can fill the rest


def test_a_pool_under_max_num_seqs_requests_has_nothing_unreachable() -> None:
    pp8 = plan_for("glm53-cmp170hx-pp8")  # 1.49 requests of 768k, 8 sequences
    assert pp8["usable"] == {"sessions": pytest.approx(pp8["sessions"]), "admitted": pytest.approx(pp8["sessions"]),
                             "unreachable_gib": 0.0, "unreachable_tokens": 0, "advice": None}
