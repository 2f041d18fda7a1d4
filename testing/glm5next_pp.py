"""A tiny real glm5next decoder stack on CPU (patch 0004's and 0006's tests): the real Glm5NextModel and
Glm5NextDecoderLayer (real mHC ops, RMSNorm, dense MLP) with the attention modules swapped for a per-token stand-in
(the sparse MLA and KDA kernels are GPU-only and attention plays no part in the stage hand-off), and a faked PP
group (a process boundary) to run a slice of the layers as one stage."""

from __future__ import annotations

from types import SimpleNamespace

import torch
from torch import nn

from vllm.config import VllmConfig, set_current_vllm_config
from vllm.models.glm5next.common import model as glm5next_model
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


def text_config(mhc: bool) -> SimpleNamespace:
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


def build_model(mhc: bool, monkeypatch) -> glm5next_model.Glm5NextModel:
    monkeypatch.setattr(glm5next_model, "Glm5NextLinearAttention", TokenwiseAttention)
    monkeypatch.setattr(glm5next_model, "Glm5NextMLAAttention", TokenwiseAttention)
    vllm_config = VllmConfig()
    vllm_config.model_config = SimpleNamespace(hf_text_config=text_config(mhc))
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


def run_stage(model, start: int, end: int, first: bool, last: bool, inputs, monkeypatch):
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


def inputs():
    input_ids = torch.tensor([3, 14, 15, 92, 65])
    positions = torch.arange(NUM_TOKENS)
    return input_ids, positions
