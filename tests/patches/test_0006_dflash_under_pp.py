"""Patch 0006: glm5next opts in to vLLM's aux-hidden-state relay, so DFlash /
DFlash2 (and EAGLE-3) can draft under pipeline parallelism.

Uses the tiny real glm5next stack of testing/glm5next_pp.py (patch 0004's harness)
and vLLM's real relay pieces: the slot layout (EagleModelMixin), the
pre-allocation wrapper (reserve_aux_intermediate_tensor_slots), the relay keys
and PPHandler.relay_aux_hidden_states. A model split over three fake PP stages
must hand the drafter the same aux hidden states, in the same order, as one
stage does.
"""

from __future__ import annotations

from types import SimpleNamespace

import torch

from testing import glm5next_pp as harness
from vllm.config import VllmConfig, set_current_vllm_config
from vllm.distributed import parallel_state
from vllm.sequence import IntermediateTensors
from vllm.v1.worker.gpu.pp_utils import PPHandler
from vllm.v1.worker.gpu.spec_decode.eagle.eagle3_utils import (
    aux_hidden_state_relay_keys,
    reserve_aux_intermediate_tensor_slots,
    verify_supports_aux_hidden_states_over_pp,
)

# DFlash target_layer_ids (0, 2) -> aux layers (1, 3) after vLLM's +1; the
# 3-stage split puts both on stage boundaries, the hardest case.
AUX_LAYERS = (1, 2, 3)
STAGES = ((0, 1), (1, 3), (3, 4))


def _fake_pp(monkeypatch, rank: int, world: int):
    group = SimpleNamespace(
        is_first_rank=rank == 0,
        is_last_rank=rank == world - 1,
        world_size=world,
        rank_in_group=rank,
    )
    monkeypatch.setattr(harness.glm5next_model, "get_pp_group", lambda: group)
    monkeypatch.setattr(parallel_state, "get_pp_group", lambda: group)


def _set_stage(model, monkeypatch, rank: int, world: int, start: int, end: int):
    _fake_pp(monkeypatch, rank, world)
    model.start_layer, model.end_layer = start, end
    model._active_layers = model.layers[start:end]
    # Recomputes this stage's slot base, as model loading does per rank.
    model._set_aux_hidden_state_layers(AUX_LAYERS)


def _forward(model, input_ids, positions, intermediate, first: bool):
    with torch.no_grad():
        return model(input_ids if first else None, positions, intermediate)


def test_aux_hidden_states_are_relayed_across_stages(single_rank_dist, monkeypatch):
    model = harness.build_model(mhc=True, monkeypatch=monkeypatch)
    wrapper = SimpleNamespace(model=model)  # what the runner's helpers unwrap
    input_ids, positions = harness.inputs()
    with set_current_vllm_config(VllmConfig()):
        verify_supports_aux_hidden_states_over_pp(wrapper, "dflash")

        _set_stage(model, monkeypatch, 0, 1, 0, harness.NUM_LAYERS)
        single_hidden, single_aux = _forward(model, input_ids, positions, None, True)
        assert len(single_aux) == len(AUX_LAYERS)

        intermediate = None
        for rank, (start, end) in enumerate(STAGES):
            _set_stage(model, monkeypatch, rank, len(STAGES), start, end)
            out = _forward(model, input_ids, positions, intermediate, rank == 0)
            if rank == len(STAGES) - 1:
                break
            assert isinstance(out, IntermediateTensors)
            # What the runner does on a middle stage: pass upstream aux on.
            keys = aux_hidden_state_relay_keys(wrapper)
            out = PPHandler.relay_aux_hidden_states(
                SimpleNamespace(aux_hidden_state_relay_keys=keys), intermediate, out
            )
            # The next stage's pre-allocated receive buffers match what is sent.
            _set_stage(model, monkeypatch, rank + 1, len(STAGES), *STAGES[rank + 1])
            receiver = SimpleNamespace(
                model=model,
                make_empty_intermediate_tensors=model.make_empty_intermediate_tensors,
            )
            reserve_aux_intermediate_tensor_slots(receiver)
            empty = receiver.make_empty_intermediate_tensors(
                harness.NUM_TOKENS, torch.bfloat16, torch.device("cpu")
            )
            assert {k: v.shape for k, v in empty.tensors.items()} == {
                k: v.shape for k, v in out.tensors.items()
            }
            intermediate = out

    hidden, aux = out
    torch.testing.assert_close(hidden, single_hidden, rtol=2e-2, atol=2e-2)
    assert len(aux) == len(single_aux)
    for got, want in zip(aux, single_aux):
        assert got.shape == (harness.NUM_TOKENS, harness.HIDDEN)
        torch.testing.assert_close(got, want, rtol=2e-2, atol=2e-2)
