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

from vllm.config import VllmConfig, set_current_vllm_config
from vllm.models.glm5next.common import model as glm5next_model
from vllm.sequence import IntermediateTensors
from vllm.utils.torch_utils import set_default_torch_dtype

HIDDEN = 64
NUM_LAYERS = 4
HC_MULT = 4
NUM_TOKENS = 5


class TokenwiseAttention(nn.Module):
    """Stands in for MLA/KDA: a seeded per-token projection."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__()
        self.proj = nn.Linear(HIDDEN, HIDDEN, bias=False)
        self.o_proj = SimpleNamespace(reduce_results=True)

    def forward(self, hidden_states: torch.Tensor, positions: torch.Tensor):
        return torch.tanh(self.proj(hidden_states))


def _text_config(mhc: bool) -> SimpleNamespace:
    return SimpleNamespace(
        vocab_size=97,
        hidden_size=HIDDEN,
        intermediate_size=128,
        num_hidden_layers=NUM_LAYERS,
        num_attention_heads=2,
        hidden_act="silu",
        swiglu_limit=None,
        rms_norm_eps=1e-6,
        n_routed_experts=None,
        n_shared_experts=None,
        index_topk=None,
        index_kpool_always_select_tail=True,
        layer_types=["linear_attention"] * NUM_LAYERS,
        mlp_layer_types=["dense"] * NUM_LAYERS,
        mhc=mhc,
        hc_mult=HC_MULT,
        hc_eps=1e-6,
        hc_sinkhorn_iters=20,
    )


def _build_model(mhc: bool, monkeypatch) -> glm5next_model.Glm5NextModel:
    monkeypatch.setattr(glm5next_model, "Glm5NextLinearAttention", TokenwiseAttention)
    monkeypatch.setattr(glm5next_model, "Glm5NextMLAAttention", TokenwiseAttention)
    vllm_config = VllmConfig()
    vllm_config.model_config = SimpleNamespace(hf_text_config=_text_config(mhc))
    # JIT warmup registers TileLang kernels, which exist for CUDA only.
    vllm_config.kernel_config.enable_jit_warmup = False
    torch.manual_seed(0)
    with set_current_vllm_config(vllm_config), set_default_torch_dtype(torch.bfloat16):
        model = glm5next_model.Glm5NextModel(vllm_config=vllm_config, prefix="model")
        # Parameters are allocated with torch.empty; give them seeded values.
        with torch.no_grad():
            for name, param in model.named_parameters():
                if name.endswith("_scale"):
                    param.fill_(0.5)
                elif "norm" in name:
                    param.fill_(1.0)
                else:
                    param.copy_(torch.randn_like(param, dtype=torch.float32) * 0.1)
        # What the loader does after weights are in (binds the CPU GEMMs).
        for module in model.modules():
            quant_method = getattr(module, "quant_method", None)
            if quant_method is not None:
                quant_method.process_weights_after_loading(module)
    return model


def _run(model, start: int, end: int, first: bool, last: bool, inputs, monkeypatch):
    monkeypatch.setattr(
        glm5next_model,
        "get_pp_group",
        lambda: SimpleNamespace(is_first_rank=first, is_last_rank=last),
    )
    model.start_layer, model.end_layer = start, end
    model._active_layers = model.layers[start:end]
    input_ids, positions, intermediate = inputs
    with torch.no_grad():
        return model(input_ids if first else None, positions, intermediate)


def _inputs():
    input_ids = torch.tensor([3, 14, 15, 92, 65])
    positions = torch.arange(NUM_TOKENS)
    return input_ids, positions


@pytest.mark.slow
@pytest.mark.parametrize("split", [1, 2, 3])
def test_two_stages_compute_what_one_stage_does(split, single_rank_dist, monkeypatch):
    model = _build_model(mhc=True, monkeypatch=monkeypatch)
    input_ids, positions = _inputs()
    with set_current_vllm_config(VllmConfig()):
        single = _run(
            model, 0, NUM_LAYERS, True, True, (input_ids, positions, None), monkeypatch
        )
        handoff = _run(
            model, 0, split, True, False, (input_ids, positions, None), monkeypatch
        )
        assert isinstance(handoff, IntermediateTensors)
        two_stage = _run(
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
    model = _build_model(mhc=False, monkeypatch=monkeypatch)
    input_ids, positions = _inputs()
    with set_current_vllm_config(VllmConfig()):
        single = _run(
            model, 0, NUM_LAYERS, True, True, (input_ids, positions, None), monkeypatch
        )
        handoff = _run(
            model, 0, 2, True, False, (input_ids, positions, None), monkeypatch
        )
        empty = model.make_empty_intermediate_tensors(
            NUM_TOKENS, torch.bfloat16, torch.device("cpu")
        )
        assert set(empty.tensors) == set(handoff.tensors)
        assert empty["hidden_states"].shape == handoff["hidden_states"].shape
        assert empty["hidden_states"].shape == (NUM_TOKENS, HIDDEN)
        two_stage = _run(
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
