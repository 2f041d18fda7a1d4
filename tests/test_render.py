"""rigstack.render: profiles become argv lists, env mappings and compose data, which vLLM's own parser accepts."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import yaml

from rigstack.errors import UserError
from rigstack.profiles import list_profiles, load_profile
from rigstack.render import SERVER_MODULE, compose, docker_run, flag_args, serve_command

MODEL = Path("/m/tiny")  # --model overrides the profile's path, so nothing is built or looked up


def test_flag_args_forms() -> None:
    assert flag_args({"a": True, "b": False, "c": {"k": "v", "n": 7}, "d": [1, "x"], "e": 0.9}) == [
        "--a", "--no-b", "--c", '{"k":"v","n":7}', "--d", "1", "x", "--e", "0.9"]


def test_cpu_tiny_serve_command() -> None:
    command = serve_command(load_profile("cpu-tiny"), model=MODEL, port=8123)
    assert command.argv == [
        sys.executable, "-m", SERVER_MODULE, "--model", "/m/tiny", "--served-model-name", "tiny",
        "--host", "127.0.0.1", "--port", "8123", "--dtype", "bfloat16", "--max-model-len", "2048",
        "--max-num-seqs", "4", "--enable-auto-tool-choice", "--tool-call-parser", "glm47"]
    assert command.env == {"VLLM_CPU_KVCACHE_SPACE": "1"}


def test_pp2_renders_partition_and_binding() -> None:
    command = serve_command(load_profile("cpu-tiny-pp2"), model=MODEL, python="/venv/bin/python")
    assert command.argv[:3] == ["/venv/bin/python", "-m", SERVER_MODULE]
    assert command.argv[command.argv.index("--pipeline-parallel-size") + 1] == "2"
    assert command.env == {"VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_CPU_OMP_THREADS_BIND": "0|1",
                           "VLLM_PP_LAYER_PARTITION": "3,1"}


def test_cmp170hx_flags_and_drafter() -> None:
    argv = serve_command(load_profile("cmp170hx-8x-pp8")).argv
    assert argv[argv.index("--model") + 1] == "/data/models/GLM-5.3-Flash-NVFP4"
    assert "--disable-prefix-caching" in argv and "--async-scheduling" in argv
    spec = json.loads(argv[argv.index("--speculative-config") + 1])
    assert spec == {"method": "dflash", "num_speculative_tokens": 7, "model": "/data/models/GLM-5.3-Flash-DFlash2"}
    assert argv[argv.index("--kernel-config") + 1] == '{"moe_backend":"marlin"}'


def test_replicas_get_their_own_gpus_and_ports() -> None:
    profile = load_profile("rtxpro6000-tp2-replicas")
    first, second = (serve_command(profile, replica=i) for i in range(2))
    assert (first.env["CUDA_VISIBLE_DEVICES"], second.env["CUDA_VISIBLE_DEVICES"]) == ("0,1", "2,3")
    assert first.argv[first.argv.index("--port") + 1] == "8000"
    assert second.argv[second.argv.index("--port") + 1] == "8001"
    with pytest.raises(UserError, match="has 2 replica"):
        serve_command(profile, replica=2)


def test_docker_run_argv() -> None:
    argv = docker_run(load_profile("rtxpro6000-tp2-replicas"), replica=1)
    image = "rigstack/vllm:0.34.0-rtxpro6000-tp2-replicas"
    assert argv[:4] == ["docker", "run", "--rm", "--name"]
    assert argv[argv.index("--gpus") + 1] == '"device=2,3"'
    assert argv[argv.index("-p") + 1] == "0.0.0.0:8001:8001"
    mount = "/models/glm53-flash-w4a16-e4m3-k32"
    assert "HF_HUB_OFFLINE=1" in argv and f"{mount}:{mount}:ro" in argv
    assert not any(arg.startswith("CUDA_VISIBLE_DEVICES=") for arg in argv)  # docker renumbers the cards
    tail = argv[argv.index("--entrypoint"):]
    assert tail[:5] == ["--entrypoint", "python3", image, "-m", SERVER_MODULE]
    assert tail[tail.index("--port") + 1] == "8001" and tail[tail.index("--host") + 1] == "0.0.0.0"
    single = docker_run(load_profile("cmp170hx-8x-pp8"))
    assert single[single.index("--gpus") + 1] == "all"
    assert "/data/models/GLM-5.3-Flash-DFlash2:/data/models/GLM-5.3-Flash-DFlash2:ro" in single


def test_docker_run_needs_an_image() -> None:
    with pytest.raises(UserError, match="names no image"):
        docker_run(load_profile("cpu-tiny"), model=MODEL)


def test_compose_one_service_per_replica(tmp_path: Path) -> None:
    profile_path = tmp_path / "four.yaml"
    profile_path.write_text("extends: rtxpro6000-tp2-replicas\nparallel:\n  replicas: 4\n")
    data = yaml.safe_load(yaml.safe_dump(compose(load_profile(profile_path))))
    services = data["services"]
    assert services.pop("router")["depends_on"]["four-3"] == {"condition": "service_healthy"}
    assert list(services) == ["four-0", "four-1", "four-2", "four-3"]
    devices = [s["deploy"]["resources"]["reservations"]["devices"][0]["device_ids"] for s in services.values()]
    assert devices == [["0", "1"], ["2", "3"], ["4", "5"], ["6", "7"]]
    assert [s["ports"] for s in services.values()] == [[f"0.0.0.0:{p}:{p}"] for p in range(8000, 8004)]
    assert services["four-2"]["depends_on"] == {"four-1": {"condition": "service_healthy"}}
    assert "depends_on" not in services["four-0"]
    assert services["four-3"]["command"][services["four-3"]["command"].index("--tensor-parallel-size") + 1] == "2"


def test_every_profile_renders_to_argv_vllm_accepts() -> None:
    """vLLM's real serve parser (no boot) takes every shipped profile's argv, and reads the values back."""
    from vllm.entrypoints.common.cli_args import make_arg_parser
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = make_arg_parser(FlexibleArgumentParser())
    for name in list_profiles():
        profile = load_profile(name)
        args = parser.parse_args(serve_command(profile, model=MODEL).argv[3:])
        assert args.model == "/m/tiny" and args.served_model_name == [profile.model.served_name]
        assert args.pipeline_parallel_size == profile.parallel.pp
        assert args.tensor_parallel_size == profile.parallel.tp
        assert args.max_model_len == profile.vllm["max-model-len"]
        if "enable-prefix-caching" in profile.vllm:
            assert args.enable_prefix_caching is profile.vllm["enable-prefix-caching"]
