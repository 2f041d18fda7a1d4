"""Patch 0004: GLM-5.3-Flash (glm5next) pipeline parallel.

A tiny glm5next decoder stack is built with the real Glm5NextModel and
Glm5NextDecoderLayer classes (real mHC ops, RMSNorm, dense MLP) on CPU. Only the
attention modules are swapped for a per-token stand-in, because the sparse MLA
and KDA kernels are GPU-only and attention plays no part in the stage hand-off.
The PP group is faked (it is a process boundary): the same weights run as one
stage and as two stages, and the two-stage result must equal the single one.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from torch import nn

from testing.glm5next_pp import (
    HC_MULT,
    HIDDEN,
    NUM_LAYERS,
    NUM_TOKENS,
    build_model,
    glm5next_model,
    inputs,
    run_stage,
)
from vllm.config import VllmConfig, set_current_vllm_config
from vllm.sequence import IntermediateTensors


@pytest.mark.slow
@pytest.mark.parametrize("split", [1, 2, 3])
def test_two_stages_compute_what_one_stage_does(split, single_rank_dist, monkeypatch):
    model = build_model(mhc=True, monkeypatch=monkeypatch)
    input_ids, positions = inputs()
    with set_current_vllm_config(VllmConfig()):
        single = run_stage(
            model, 0, NUM_LAYERS, True, True, (input_ids, positions, None), monkeypatch
        )
        handoff = run_stage(
            model, 0, split, True, False, (input_ids, positions, None), monkeypatch
        )
        assert isinstance(handoff, IntermediateTensors)
        two_stage = run_stage(
            model,
            split,
            NUM_LAYERS,
            False,
            True,
            (input_ids, positions, handoff),
            monkeypatch,
        )
        assert single.shape == (NUM_TOKENS, HIDDEN)
        assert not torch.isnan(single).any()
        torch.testing.assert_close(two_stage, single, rtol=2e-2, atol=2e-2)
        # What the receiving stage pre-allocates must match what is sent.
        empty = model.make_empty_intermediate_tensors(
            NUM_TOKENS, torch.bfloat16, torch.device("cpu")
        )
    assert {k: v.shape for k, v in empty.tensors.items()} == {
        k: v.shape for k, v in handoff.tensors.items()
    }
    assert empty["hidden_states"].shape == (NUM_TOKENS, HC_MULT, HIDDEN)


def test_non_mhc_stage_handoff_shapes(single_rank_dist, monkeypatch):
    model = build_model(mhc=False, monkeypatch=monkeypatch)
    input_ids, positions = inputs()
    with set_current_vllm_config(VllmConfig()):
        single = run_stage(
            model, 0, NUM_LAYERS, True, True, (input_ids, positions, None), monkeypatch
        )
        handoff = run_stage(
            model, 0, 2, True, False, (input_ids, positions, None), monkeypatch
        )
        empty = model.make_empty_intermediate_tensors(
            NUM_TOKENS, torch.bfloat16, torch.device("cpu")
        )
        assert set(empty.tensors) == set(handoff.tensors)
        assert empty["hidden_states"].shape == handoff["hidden_states"].shape
        assert empty["hidden_states"].shape == (NUM_TOKENS, HIDDEN)
        two_stage = run_stage(
            model,
            2,
            NUM_LAYERS,
            False,
            True,
            (input_ids, positions, handoff),
            monkeypatch,
        )
    torch.testing.assert_close(two_stage, single, rtol=2e-2, atol=2e-2)


def test_causal_lm_exposes_the_factory():
    """The served class delegates make_empty_intermediate_tensors to its model."""
    lm = glm5next_model.Glm5NextForCausalLM.__new__(glm5next_model.Glm5NextForCausalLM)
    nn.Module.__init__(lm)
    lm.model = SimpleNamespace(
        make_empty_intermediate_tensors=lambda b, dtype, device: IntermediateTensors(
            {"hidden_states": torch.zeros(b, 1, dtype=dtype, device=device)}
        )
    )
    out = lm.make_empty_intermediate_tensors(3, torch.float32, torch.device("cpu"))
    assert out["hidden_states"].shape == (3, 1)
