"""A card's memory as the driver reports it (issue 38 item 4): profiles give nvidia-smi's MiB, an ambiguous owner
figure is planned at both readings with the smaller deciding, and preflight on the rig plans with NVML's reading."""

from __future__ import annotations

from pathlib import Path

import pytest

from rigstack.errors import UserError
from rigstack.planner.profile_plan import plan_for
from rigstack.preflight import model
from rigstack.preflight.core import Status
from rigstack.profiles import load_profile
from testing.preflight import cmp, context, profile_at


def test_memory_is_given_once_and_the_smallest_reading_is_the_cards(tmp_path: Path) -> None:
    both = tmp_path / "both.yaml"
    both.write_text("extends: cmp170hx-8x-pp8\nhardware:\n  memory_gib: 64\n")
    with pytest.raises(UserError, match="give memory_mib .* or memory_gib, not both"):
        load_profile(both)
    seed002 = load_profile("cmp170hx-8x-pp8").hardware
    assert seed002.readings_gib == (64.0, 61035 / 1024) and seed002.card_gib == 61035 / 1024
    assert load_profile("rtxpro6000-tp2-replicas").hardware.card_gib == 97887 / 1024


def test_an_ambiguous_owner_figure_is_planned_at_both_readings_and_the_smaller_decides() -> None:
    plan = plan_for("cmp170hx-8x-pp8")
    assert plan["memory_gib"] == pytest.approx(61035 / 1024)
    [other] = plan["other_readings"]
    assert other["memory_gib"] == 64.0 and other["pool_tokens"] > plan["pool_tokens"]
    assert plan_for("cmp170hx-8x-pp8", memory_gib=64.0)["pool_tokens"] == other["pool_tokens"]
    assert plan_for("glm53-cmp170hx-pp8")["other_readings"] == []  # seed 003 says GiB


def test_preflight_on_the_rig_plans_with_nvmls_reading(tmp_path: Path) -> None:
    rig = profile_at(tmp_path, "extends: cmp170hx-8x-pp8\nhardware:\n  gpu_name: CMP\n")
    # The profile's readings are 59.6 and 64 GiB; these cards report 58 (an unlock that took less).
    result = model.kv_room(context(rig, gpus=cmp(memory_gib=58.0)))
    assert result.status is not Status.FAIL and "cards of 58.00 GiB, NVML's reading" in result.reason, result
    assert "cards of 59.60 GiB, the profile's" in model.kv_room(context(rig)).reason
