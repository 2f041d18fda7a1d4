"""Fleets (issue 30) without a boot: the shipped layouts, the errors a bad fleet gets at load (file and line), the
gateway's config, the dry run run as printed, the fleet's own preflight checks, and the stop order (the gateway
first) on real processes. The boot is tests/test_fleet_e2e.py."""

from __future__ import annotations

import argparse
import shlex
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from rigstack import fleetlaunch, gateway
from rigstack.serving import process, runrecord
from rigstack.errors import UserError
from rigstack.fleets import list_fleets, load_fleet, pool_gpus
from rigstack.preflight.core import Status
from rigstack.preflight.fleet import pool_cards, ports
from rigstack.preflight.fleet import gateway as gateway_check
from rigstack.preflight.nvml import Gpu, GpuScan
from testing.net import free_port

ROOT = Path(__file__).resolve().parent.parent
MIXED = "rtxpro6000-8x-mixed"


def _fleet(tmp_path: Path, text: str, name: str = "fleet") -> Path:
    path = tmp_path / f"{name}.yaml"
    path.write_text(text)
    return path


def _error(path: Path) -> str:
    with pytest.raises(UserError) as caught:
        load_fleet(path)
    return str(caught.value)


def test_seed_004s_layouts_load_as_the_seed_runs_them() -> None:
    assert list_fleets() == ["cpu-tiny-mixed", "rtxpro6000-8x-glm", MIXED]
    mixed = load_fleet(MIXED)
    assert mixed.served_names == ["qwen3.8-flash-next", "glm-5.3-flash"] and mixed.port == 8080
    assert [pool_gpus(pool) for pool in mixed.pools] == [[0, 1, 2, 3], [4, 5, 6, 7]]
    qwen, glm = mixed.pools
    assert (qwen.parallel.tp, qwen.parallel.replicas) == (4, 1) and (glm.parallel.tp, glm.parallel.replicas) == (2, 2)
    assert glm.router is not None and glm.router.policy == "cache_aware"
    glm8 = load_fleet("rtxpro6000-8x-glm")
    assert glm8.served_names == ["glm-5.3-flash"] and pool_gpus(glm8.pools[0]) == list(range(8))
    cpu = load_fleet("cpu-tiny-mixed")
    assert cpu.served_names == ["tiny-a", "tiny-b"] and [pool.parallel.replicas for pool in cpu.pools] == [2, 1]
    # A profile states the RAM of its own replicas; a member that runs another count is scaled.
    assert [pool.hardware.host_ram_gib for pool in cpu.pools] == [7.0, 4.0]


def test_a_one_engine_member_is_pinned_to_its_cards(tmp_path: Path) -> None:
    """Qwen's single TP4 engine on 0-3 gets CUDA_VISIBLE_DEVICES, and docker its devices, like a replica."""
    units = fleetlaunch.fleet_units(load_fleet(MIXED), tmp_path)
    qwen_engine, qwen_router = units[0][1]
    assert "device=0,1,2,3" in " ".join(qwen_engine.argv) and "--gpus" in qwen_engine.argv
    assert qwen_router.argv[qwen_router.argv.index("--worker-urls") + 1] == "http://127.0.0.1:8000"
    glm = units[1][1]
    assert ['"device=4,5"', '"device=6,7"'] == [unit.argv[unit.argv.index("--gpus") + 1] for unit in glm[:2]]
    assert [unit.run_dir.relative_to(tmp_path).as_posix() for unit in glm] == [
        "pool-1/replica-0", "pool-1/replica-1", "pool-1/router"]


BASE = "host: 127.0.0.1\nport: 8080\ndescription: test\nmembers:\n"
GLM = "  - profile: rtxpro6000-tp2-replicas\n"
GLM0 = GLM + "    gpu_sets: [[0, 1], [2, 3]]\n    router_port: 8090\n"  # on 0-3, its router off the gateway's port


@pytest.mark.parametrize(("text", "line", "expected"), [
    (GLM0 + GLM + "    gpu_sets: [[2, 3], [4, 5]]\n    port: 8100\n    router_port: 8092\n    metrics_port: 29002\n", 9,
     "members.1.gpu_sets: GPU 2 is also in members.0's sets (rtxpro6000-tp2-replicas); give each member its own GPUs"),
    ("  - profile: rtxpro6000-tp4-qwen38-flash-next\n    gpu_sets: [[0, 1, 2, 3]]\n"
     "  - profile: glm-as-qwen\n    gpu_sets: [[4, 5], [6, 7]]\n    port: 8010\n    router_port: 8091\n"
     "    metrics_port: 29001\n", 7,
     "members.1.profile: serves 'qwen3.8-flash-next' from /models/glm53-flash-w4a16-e4m3-k32, members.0 from "
     "/models/qwen3.8-flash-next; one name must mean one checkpoint"),
    (GLM + "    gpu_sets: [[0, 1], [2, 3]]\n" + GLM + "    gpu_sets: [[4, 5], [6, 7]]\n    port: 8010\n"
     "    router_port: 8091\n    metrics_port: 29001\n", 7, "one model name is one pool: raise that member's replicas"),
    (GLM0 + "  - profile: rtxpro6000-tp4-qwen38-flash-next\n    gpu_sets: [[4, 5, 6, 7]]\n"
     "    port: 8001\n    router_port: 8091\n    metrics_port: 29001\n", 10,
     "members.1.port: port 8001 of members.1 replica 0 is also members.0 replica 1's"),
    (GLM0 + "  - profile: rtxpro6000-tp4-qwen38-flash-next\n    gpu_sets: [[4, 5, 6, 7]]\n"
     "    port: 8010\n    router_port: 8080\n    metrics_port: 29001\n", 11,
     "members.1.router_port: port 8080 of members.1 router is also the gateway (port)'s"),
    ("  - profile: " + MIXED + "\n", 5, f"members.0.profile: {MIXED} is a fleet, not a profile; fleets do not nest"),
    ("  - profile: cpu-tiny-2hosts-pp2\n    router_port: 8091\n", 5, "spans hosts (hosts:); a fleet runs on one host"),
    ("  - profile: cpu-tiny\n", 5, "profile cpu-tiny has no router:, and each member runs behind its own vllm-router; "
                                   "give router_port"),
    (GLM + "    gpu_sets: [[0], [1]]\n", 6, "members.0.gpu_sets: 'gpu_sets': set 0 [0] has 1 GPU(s), a replica of "
     "tp 2"),
    (GLM + "    replica: 2\n", 6, "members.0.replica: unknown key; did you mean 'replicas'?"),
    ("  - profile: no-such-profile\n", 5, "members.0.profile: no profile named 'no-such-profile'"),
])
def test_bad_fleets_fail_at_load_naming_file_and_line(tmp_path: Path, text: str, line: int, expected: str) -> None:
    (tmp_path / "glm-as-qwen.yaml").write_text("extends: rtxpro6000-tp2-replicas\nmodel:\n  served_name: "
                                               "qwen3.8-flash-next\n")
    message = _error(_fleet(tmp_path, BASE + text))
    assert message.startswith(f"{tmp_path / 'fleet.yaml'}:{line}: ") and expected in message, message
    assert "\n" not in message


def test_a_fleet_named_as_a_member_by_path_is_refused(tmp_path: Path) -> None:
    inner = _fleet(tmp_path, BASE + "  - profile: cpu-tiny-a\n", "inner")
    assert "is a fleet, not a profile" in _error(_fleet(tmp_path, BASE + f"  - profile: {inner}\n"))


def test_the_gateway_routes_each_model_to_its_pools_router() -> None:
    config = gateway.litellm_config(load_fleet(MIXED))
    assert [(entry["model_name"], entry["litellm_params"]["model"], entry["litellm_params"]["api_base"])
            for entry in config["model_list"]] == [
        ("qwen3.8-flash-next", "openai/qwen3.8-flash-next", "http://127.0.0.1:8090/v1"),
        ("glm-5.3-flash", "openai/glm-5.3-flash", "http://127.0.0.1:8091/v1")]
    assert config["litellm_settings"]["callbacks"] == f"{gateway.HOOK_MODULE}.hook"
    assert config["general_settings"] == {"dangerously_permit_weak_or_unset_master_key": True}


def test_a_fleet_with_a_key_makes_the_gateway_ask_for_it(tmp_path: Path) -> None:
    path = _fleet(tmp_path, "port: 8080\ndescription: test\ngateway:\n  api_key_env: FLEET_KEY\nmembers:\n"
                            "  - profile: cpu-tiny-a\n")
    assert gateway.litellm_config(load_fleet(path))["general_settings"] == {"master_key": "os.environ/FLEET_KEY"}


def test_a_keyed_fleet_whose_key_is_unset_starts_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 39 item 4: with the variable unset every pool booted first, then the gateway failed without naming it."""
    path = _fleet(tmp_path, "port: 8080\ndescription: test\ngateway:\n  api_key_env: FLEET_KEY_UNSET\nmembers:\n"
                            "  - profile: cpu-tiny-a\n")
    monkeypatch.delenv("FLEET_KEY_UNSET", raising=False)
    with pytest.raises(UserError, match="gateway.api_key_env names FLEET_KEY_UNSET, which is not set here; export "
                                        "it .* nothing was started"):
        fleetlaunch.serve_fleet(str(path), run_dir=tmp_path / "run", force=True)
    assert not (tmp_path / "run").exists()


def _dry_run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "scripts/run_prod.py", *args, "--dry-run"], cwd=ROOT,
                          capture_output=True, text=True, timeout=300, check=False)


def test_the_dry_run_prints_every_command_and_they_run_as_printed(tmp_path: Path) -> None:
    done = _dry_run("--fleet", MIXED, "--run-dir", str(tmp_path / "run"))
    assert done.returncode == 0, done.stderr
    blocks = done.stdout.strip().split("\n\n")
    # Qwen's engine and router, GLM's two replicas and router, then the gateway's files and the gateway.
    assert len(blocks) == 7 and not (tmp_path / "run").exists()
    assert "docker run" in blocks[0] and "vllm_router.launch_router" in blocks[1] and "--port 8090" in blocks[1]
    assert "--port 8010" in blocks[2] and "--port 8011" in blocks[3] and "--port 8091" in blocks[4]
    assert blocks[6].split(" \\\n")[1].strip().endswith("/bin/litellm") and "--port 8080" in blocks[6]
    # The gateway's files, written by the printed command itself, are the ones the launcher writes.
    subprocess.run(["bash", "-c", blocks[5]], check=True, timeout=30)
    folder = tmp_path / "run" / "gateway"
    assert yaml.safe_load((folder / gateway.CONFIG_NAME).read_text()) == gateway.litellm_config(load_fleet(MIXED))
    assert (folder / f"{gateway.HOOK_MODULE}.py").read_bytes() == gateway.HOOK_SOURCE.read_bytes()
    # Each router line is one vllm-router parses; the engines' lines are the launcher's own rendering.
    from vllm_router.router_args import RouterArgs

    parser = argparse.ArgumentParser()
    RouterArgs.add_cli_args(parser)
    for block in (blocks[1], blocks[4]):
        words = shlex.split(block.replace("\\\n", " "))
        args = RouterArgs.from_cli_args(parser.parse_args(words[words.index("vllm_router.launch_router") + 1:]))
        assert args.policy == "cache_aware"


def test_a_bad_fleet_starts_nothing(tmp_path: Path) -> None:
    path = _fleet(tmp_path, BASE + "  - profile: cpu-tiny\n")
    done = subprocess.run([sys.executable, "scripts/run_prod.py", "--fleet", str(path), "--run-dir",
                           str(tmp_path / "run")], cwd=ROOT, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 1 and done.stderr.startswith(f"error: {path}:5: members.0: profile cpu-tiny has no")
    assert not (tmp_path / "run").exists()
    assert _dry_run("--fleet", "no-such-fleet").stderr.strip() == (
        "error: no fleet named 'no-such-fleet'; fleets/ holds them (cpu-tiny-mixed, rtxpro6000-8x-glm, "
        f"{MIXED})")


def _scan(count: int) -> GpuScan:
    return GpuScan(tuple(Gpu(i, "NVIDIA RTX PRO 6000", 96.0, 0.0, 0) for i in range(count)), driver="580")


def test_preflight_finds_each_pools_cards() -> None:
    fleet = load_fleet(MIXED)
    short = pool_cards(fleet, _scan(4))
    assert short.status is Status.FAIL and "members.1 (rtxpro6000-tp2-replicas) wants GPU 4, this host has 4" in \
        short.reason
    assert pool_cards(fleet, _scan(8)).status is Status.PASS
    small = GpuScan(tuple(Gpu(i, "NVIDIA RTX PRO 6000", 48.0 if i == 6 else 96.0, 0.0, 0) for i in range(8)), "580")
    assert "members.1 (rtxpro6000-tp2-replicas) wants GPU 6: it has 48.0 GiB" in pool_cards(fleet, small).reason


def test_preflight_finds_a_taken_port(tmp_path: Path) -> None:
    port = free_port()
    path = _fleet(tmp_path, f"host: 127.0.0.1\nport: {port}\ndescription: test\nmembers:\n"
                            "  - profile: cpu-tiny-a\n    port: 18555\n    router_port: 18590\n"
                            "    metrics_port: 18591\n")
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", port))
        sock.listen()
        result = ports(load_fleet(path))
    assert result.status is Status.FAIL and result.reason == f"port {port} (the gateway) is in use"


def test_preflight_names_a_missing_gateway_venv(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RIGSTACK_GATEWAY_VENV", str(tmp_path / "none"))
    result = gateway_check(load_fleet("cpu-tiny-mixed"))
    assert result.status is Status.FAIL and "has no litellm, the fleet runs litellm 1.106.12" in result.reason
    assert result.fix.startswith("make gateway")


def _recorder(folder: Path, order: Path) -> runrecord.RunRecord:
    """A process that notes its folder's name in `order` when it gets SIGTERM."""
    script = f"trap 'echo {folder.name} >> {order}; exit 0' TERM; touch {folder}/trapped; while :; do sleep 0.1; done"
    _, record = process.start(["bash", "-c", script], {}, folder, url=f"http://127.0.0.1:{free_port()}",
                             served_name="x", check_port=False)
    return record


def test_stop_ends_the_gateway_first_then_each_pool_from_its_router(tmp_path: Path) -> None:
    run_dir, order = tmp_path / "run", tmp_path / "order"
    folders = [run_dir / "pool-0" / "replica-0", run_dir / "pool-0" / "replica-1", run_dir / "pool-0" / "router",
               run_dir / "pool-1", run_dir / "pool-1" / "router", run_dir / "gateway"]
    for folder in folders:
        _recorder(folder, order)
    deadline = time.monotonic() + 60
    while not all((folder / "trapped").is_file() for folder in folders):  # every trap set before the stop
        assert time.monotonic() < deadline, "the recorders did not start"
        time.sleep(0.05)
    assert fleetlaunch.stop_fleet("cpu-tiny-mixed", run_dir=run_dir) == 0
    assert order.read_text().split() == ["gateway", "router", "replica-0", "replica-1", "router", "pool-1"]
    assert all(process.running(folder) is None for folder in folders)
    with pytest.raises(UserError, match="no running server of fleet cpu-tiny-mixed is recorded in"):
        fleetlaunch.stop_fleet("cpu-tiny-mixed", run_dir=run_dir)


@pytest.mark.parametrize(("head", "line", "expected"), [
    ("port: true", 2, "port: Input should be a valid integer"),  # it was port 1, and preflight passed it
    ("port: '8080'", 2, "port: Input should be a valid integer"),
    ("port: 8080.0", 2, "port: Input should be a valid integer"),
    ("port: 8080\ngateway:\n  timeout_s: '60'", 4, "gateway.timeout_s: Input should be a valid integer"),
])
def test_fleet_values_are_the_types_they_name(tmp_path: Path, head: str, line: int, expected: str) -> None:
    """Issue 39 item 9: the fleet schema coerced, unlike the profile's."""
    text = f"host: 127.0.0.1\n{head}\ndescription: test\nmembers:\n" + GLM0
    message = _error(_fleet(tmp_path, text))
    assert message.startswith(f"{tmp_path / 'fleet.yaml'}:{line}: {expected}"), message


def test_a_replica_port_past_65535_is_named_at_load(tmp_path: Path) -> None:
    """Issue 39 item 9: port 65535 with 2 replicas rendered port 65536, and preflight then crashed."""
    message = _error(_fleet(tmp_path, BASE + GLM0.replace("router_port: 8090", "router_port: 8090\n    port: 65535")))
    assert message.startswith(f"{tmp_path / 'fleet.yaml'}:8: members.0.port: 'port': replica 1 would listen on port "
                              "65536, past 65535; lower port: or parallel.replicas"), message


def test_a_fleet_file_that_is_not_a_mapping_is_called_a_fleet(tmp_path: Path) -> None:
    message = _error(_fleet(tmp_path, "- just\n- a list\n"))
    assert message == (f"{tmp_path / 'fleet.yaml'}:1: a fleet is a mapping of keys, got list; name a fleet's YAML "
                       "file (fleets/ holds the shipped ones)")
