"""Patch 0005: the GLM-5.3-Flash MTP draft gets its input embedding from the
checkpoint under pipeline parallelism.

Runs the real Glm5NextMTP.load_weights on a fabricated small checkpoint shaped
like GLM-5.3-Flash's: the MTP layer (model.layers.<num_hidden_layers>.*) has no
embed_tokens copy, the target's model.embed_tokens.weight is top level. The
draft is a slim Glm5NextMTP (real VocabParallelEmbedding and RMSNorm; the MLA
and MoE blocks, GPU-only, are left out: load_weights only maps names onto
parameters). The PP group is faked (a process boundary).
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from torch import nn

from vllm.config import VllmConfig, set_current_vllm_config
from vllm.model_executor.layers.layernorm import RMSNorm
from vllm.model_executor.layers.vocab_parallel_embedding import (
    VocabParallelEmbedding,
)
from vllm.models.glm5next.common import mtp as glm5next_mtp

VOCAB = 64
HIDDEN = 16
NUM_HIDDEN_LAYERS = 2  # the MTP layer is model.layers.2


def _slim_mtp() -> glm5next_mtp.Glm5NextMTP:
    mtp = glm5next_mtp.Glm5NextMTP.__new__(glm5next_mtp.Glm5NextMTP)
    nn.Module.__init__(mtp)
    mtp.config = SimpleNamespace(
        num_hidden_layers=NUM_HIDDEN_LAYERS,
        num_nextn_predict_layers=1,
        n_routed_experts=4,
        n_shared_experts=None,
        mla_use_nope=False,
        qk_rope_head_dim=0,
    )
    # What Glm5NextMTP.__init__ sets and load_weights reads (vLLM 0.34.0).
    mtp.use_mega_moe = False
    mtp.fused_shared_expert_layers = frozenset()
    mtp.num_redundant_experts = 0
    predictor = nn.Module()
    predictor.mtp_start_layer_idx = NUM_HIDDEN_LAYERS
    predictor.num_mtp_layers = 1
    layer = nn.Module()
    with set_current_vllm_config(VllmConfig()):
        layer.enorm = RMSNorm(HIDDEN)
        predictor.embed_tokens = VocabParallelEmbedding(VOCAB, HIDDEN)
    predictor.layers = nn.ModuleDict({str(NUM_HIDDEN_LAYERS): layer})
    # What torch.empty left behind: the draft's embedding before loading.
    with torch.no_grad():
        predictor.embed_tokens.weight.zero_()
    mtp.model = predictor
    return mtp


def _checkpoint(target_embed: torch.Tensor, *, with_embed: bool = True):
    """GLM-5.3-Flash layout: the MTP layer has no embed_tokens copy."""
    weights = [
        ("model.embed_tokens.weight", target_embed),
        ("model.layers.0.input_layernorm.weight", torch.ones(HIDDEN)),
        (f"model.layers.{NUM_HIDDEN_LAYERS}.enorm.weight", torch.full((HIDDEN,), 2.0)),
        ("lm_head.weight", torch.randn(VOCAB, HIDDEN)),
    ]
    if not with_embed:
        weights = weights[1:]
    return weights


def _fake_pp(monkeypatch, world_size: int) -> None:
    monkeypatch.setattr(
        glm5next_mtp,
        "get_pp_group",
        lambda: SimpleNamespace(world_size=world_size),
        raising=False,
    )


def test_draft_embedding_comes_from_the_checkpoint_under_pp(
    single_rank_dist, monkeypatch
):
    _fake_pp(monkeypatch, world_size=2)
    mtp = _slim_mtp()
    target_embed = torch.randn(VOCAB, HIDDEN)
    loaded = mtp.load_weights(_checkpoint(target_embed))

    assert "model.embed_tokens.weight" in loaded
    torch.testing.assert_close(mtp.model.embed_tokens.weight.data, target_embed)
    # The MTP layer's own weights still load.
    assert torch.all(mtp.model.layers[str(NUM_HIDDEN_LAYERS)].enorm.weight == 2.0)
    # And the draft embeds token ids with it (what proposing starts from).
    ids = torch.tensor([0, 5, 63])
    torch.testing.assert_close(mtp.model.embed_tokens(ids), target_embed[ids])


@pytest.mark.upstream_guard
def test_single_stage_keeps_upstream_loading(single_rank_dist, monkeypatch):
    # PP size 1: the runner shares the target's embedding afterwards, so the
    # draft does not read the target's copy.
    _fake_pp(monkeypatch, world_size=1)
    mtp = _slim_mtp()
    loaded = mtp.load_weights(_checkpoint(torch.randn(VOCAB, HIDDEN)))
    assert "model.embed_tokens.weight" not in loaded
    assert torch.count_nonzero(mtp.model.embed_tokens.weight) == 0


def test_missing_embedding_under_pp_fails_loudly(single_rank_dist, monkeypatch):
    # No embedding anywhere in the checkpoint: a loud error instead of drafting
    # from an empty embedding.
    _fake_pp(monkeypatch, world_size=2)
    mtp = _slim_mtp()
    with pytest.raises(ValueError, match="embed_tokens"):
        mtp.load_weights(_checkpoint(torch.randn(VOCAB, HIDDEN), with_embed=False))
