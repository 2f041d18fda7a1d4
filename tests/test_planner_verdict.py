"""The planner's three-valued verdict (rigstack/planner/verdict.py, issue 38 item 2), on real plans (vLLM's own KV
code): a start inside the error bar is `marginal` and names levers that, planned, start; the planner's own checks
refuse; what it cannot check is listed, not assumed."""

from __future__ import annotations

import re
from pathlib import Path

from rigstack.planner.profile_plan import plan_for
from rigstack.planner.verdict import ERROR_BAR_GIB


def test_a_start_inside_the_error_bar_is_marginal_and_its_levers_start() -> None:
    # Seed 004's own 524,288-token context on its 96 GB cards: vLLM's check passes, by less than the bar.
    seeds = plan_for("rtxpro6000-tp2-replicas", max_model_len=524_288)
    verdict = seeds["verdict"]
    assert seeds["starts"] and verdict["value"] == "marginal", verdict
    assert 0 < verdict["margin_gib"] < ERROR_BAR_GIB == verdict["error_bar_gib"]
    longest = int(re.search(r"max-model-len ([\d,]+) \(planned\)", verdict["why"]).group(1).replace(",", ""))
    util = float(re.search(r"gpu-memory-utilization ([\d.]+)", verdict["why"]).group(1))
    assert plan_for("rtxpro6000-tp2-replicas", max_model_len=longest)["verdict"]["value"] == "starts"
    block = seeds["block_size"]
    assert plan_for("rtxpro6000-tp2-replicas", max_model_len=longest + block)["verdict"]["value"] == "marginal"
    assert plan_for("rtxpro6000-tp2-replicas", max_model_len=524_288, util=util)["verdict"]["value"] == "starts"
    # The shipped profile takes the shorter context, and says so.
    shipped = plan_for("rtxpro6000-tp2-replicas")
    assert shipped["verdict"]["value"] == "starts" and shipped["max_model_len"] <= longest


def test_an_attention_backend_the_rig_cannot_run_is_refused(tmp_path: Path) -> None:
    # FlashMLA's sparse kernels are SM9x+: on the L40s (sm_89) vLLM's selector rules it out, KV room or not.
    path = tmp_path / "l40-flashmla.yaml"
    path.write_text("extends: l40-8x-tp8\nvllm:\n  attention-backend: FLASHMLA_SPARSE\n")
    result = plan_for(str(path))
    assert result["starts"]  # vLLM's KV check alone would pass
    assert result["verdict"]["value"] == "refused", result["verdict"]
    assert "attention-backend FLASHMLA_SPARSE is not valid for this rig" in result["verdict"]["why"]
    assert "compute capability not supported" in result["verdict"]["why"]


def test_a_backend_that_cannot_be_imported_here_is_listed_unchecked_not_assumed() -> None:
    # sm_120 with GLM-5.3-Flash: only FlashInfer's sparse MLA decode could take it, and FlashInfer is not here.
    offload = plan_for("rtxpro6000-1x-offload")
    assert offload["attention_backend"]["picked"] is None
    assert [item.split(" ")[0] for item in offload["verdict"]["unchecked"]] == ["FLASHINFER_MLA_SPARSE_SM120"]
    assert "kv-room" in offload["verdict"]["unchecked"][0]
    # A profile that names its backend (seed 003's TRITON_MLA_SPARSE) leaves vLLM nothing to rank: nothing unchecked.
    assert plan_for("glm53-cmp170hx-pp9")["verdict"]["unchecked"] == []


def test_cpu_plans_have_no_error_bar() -> None:
    # The twin's pools equal the planner's exactly (tests/test_planner.py); the fit is of GPU memory.
    tiny = plan_for("cpu-tiny")
    assert tiny["verdict"]["error_bar_gib"] == 0 and tiny["verdict"]["value"] == "starts"
