"""rigstack.replicas and the profile shapes it reads: GPU sets, the router unit, its compose service, dry runs and
the errors a bad layout gets before anything starts (the real boot is tests/test_replicas_e2e.py)."""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from rigstack import launch, render
from rigstack.errors import UserError
from rigstack.preflight.core import Context, Status
from rigstack.preflight.nvml import Gpu, GpuScan
from rigstack.preflight.scale import replica_sets, router
from rigstack.profiles import load_profile
from rigstack.replicas import ROUTER_MODULE, public_ports, with_router

ROOT = Path(__file__).resolve().parent.parent


def _profile(tmp_path: Path, text: str, name: str = "layout") -> Path:
    path = tmp_path / f"{name}.yaml"
    path.write_text(text)
    return path


def _error(path: Path) -> str:
    with pytest.raises(UserError) as caught:
        load_profile(path)
    return str(caught.value)


def test_gpu_sets_pick_each_replicas_cards(tmp_path: Path) -> None:
    path = _profile(tmp_path, "extends: rtxpro6000-tp2-replicas\nparallel:\n  gpu_sets: [[4, 5], [6, 7]]\n")
    profile = load_profile(path)
    envs = [render.serve_command(profile, replica=i).env["CUDA_VISIBLE_DEVICES"] for i in range(2)]
    assert envs == ["4,5", "6,7"]
    assert profile.gpus_needed == 8  # the host must have cards up to index 7


@pytest.mark.parametrize(("text", "expected"), [
    ("parallel:\n  gpu_sets: [[0, 1], [1, 2]]\n", "GPU 1 is in set 0 and set 1; give each replica its own GPUs"),
    ("parallel:\n  replicas: 4\n  gpu_sets: [[0, 1], [2, 3]]\n", "4 replicas but only 2 GPU set(s)"),
    ("parallel:\n  gpu_sets: [[0], [1]]\n", "set 0 [0] has 1 GPU(s), a replica of tp 2 x pp 1 needs 2"),
    ("router:\n  port: 8001\n", "layout.yaml:3: router.port: 8001 is also a replica's port (8000 to 8001)"),
    ("router:\n  port: 8080\n  policy: fastest\n", "router.policy"),
])
def test_bad_layouts_fail_at_load_with_the_line(tmp_path: Path, text: str, expected: str) -> None:
    message = _error(_profile(tmp_path, "extends: rtxpro6000-tp2-replicas\n" + text))
    assert expected in message and "layout.yaml:" in message


def test_router_unit_comes_last_and_points_at_every_replica(tmp_path: Path) -> None:
    profile = load_profile("cpu-tiny-replicas")
    units = with_router(profile, launch.planned_units(profile, tmp_path / "m", tmp_path), tmp_path, python="py")
    assert [unit.run_dir.name for unit in units] == ["replica-0", "replica-1", "router"]
    argv = units[-1].argv
    assert argv[:3] == ["py", "-m", ROUTER_MODULE]
    assert argv[argv.index("--worker-urls") + 1:argv.index("--policy")] == ["http://127.0.0.1:8000",
                                                                           "http://127.0.0.1:8001"]
    assert argv[argv.index("--policy") + 1] == "cache_aware" and argv[argv.index("--port") + 1] == "8080"
    assert units[-1].url == "http://127.0.0.1:8080"
    caches = {unit.env["VLLM_CACHE_ROOT"] for unit in units[:2]}
    assert len(caches) == 2 and all("cpu-tiny-replicas/replica-" in cache for cache in caches)
    assert public_ports(profile) == [8000, 8001, 8080, 29000]


def test_the_routers_argv_is_one_vllm_router_accepts(tmp_path: Path) -> None:
    """vllm-router parses its own flags before it contacts any worker: an unknown flag or policy fails here."""
    profile = load_profile("cpu-tiny-replicas")
    argv = with_router(profile, launch.planned_units(profile, tmp_path / "m", tmp_path), tmp_path)[-1].argv
    from vllm_router.router_args import RouterArgs

    parser = argparse.ArgumentParser()
    RouterArgs.add_cli_args(parser)
    args = RouterArgs.from_cli_args(parser.parse_args(argv[3:]))
    assert args.policy == "cache_aware" and args.health_check_interval_secs == 1
    assert args.worker_urls == ["http://127.0.0.1:8000", "http://127.0.0.1:8001"]


def test_compose_gets_the_router_after_every_replica() -> None:
    services = render.compose(load_profile("rtxpro6000-tp2-replicas"))["services"]
    assert list(services)[-1] == "router"
    assert yaml.safe_load(yaml.safe_dump(services)) == services
    service = services["router"]
    assert service["depends_on"] == {name: {"condition": "service_healthy"} for name in list(services)[:-1]}
    command = service["command"]
    assert command[command.index("--worker-urls") + 1:command.index("--policy")] == [
        "http://rtxpro6000-tp2-replicas-0:8000", "http://rtxpro6000-tp2-replicas-1:8001"]
    assert service["ports"] == ["0.0.0.0:8080:8080"] and service["entrypoint"][-1] == ROUTER_MODULE


def test_dry_run_prints_every_unit_and_the_router() -> None:
    done = subprocess.run([sys.executable, "scripts/run_prod.py", "--profile", "cpu-tiny-replicas", "--dry-run"],
                          cwd=ROOT, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    blocks = done.stdout.strip().split("\n\n")
    assert len(blocks) == 3
    assert "--port 8000" in blocks[0] and "--port 8001" in blocks[1] and "replica-1/vllm" in blocks[1]
    assert ROUTER_MODULE in blocks[2] and "--policy cache_aware" in blocks[2]


def test_a_bad_layout_starts_nothing(tmp_path: Path) -> None:
    path = _profile(tmp_path, "extends: cpu-tiny-replicas\nrouter:\n  port: 8001\n")
    done = subprocess.run([sys.executable, "scripts/run_prod.py", "--profile", str(path), "--run-dir",
                           str(tmp_path / "run")], cwd=ROOT, capture_output=True, text=True, timeout=120,
                          check=False)
    assert done.returncode == 1 and "is also a replica's port" in done.stderr
    assert not (tmp_path / "run").exists()


def _scan(count: int) -> GpuScan:
    return GpuScan(tuple(Gpu(i, "NVIDIA RTX PRO 6000", 96.0, 0.0, 0) for i in range(count)), driver="580")


def test_preflight_finds_missing_gpus_of_a_set(tmp_path: Path) -> None:
    profile = load_profile(_profile(tmp_path, "extends: rtxpro6000-tp2-replicas\nparallel:\n  gpu_sets: [[0, 1], "
                                              "[4, 5]]\n"))
    ctx = Context(profile, model=None, package=None)
    ctx.gpus = _scan(4)  # cached_property: a host with four cards
    result = replica_sets(ctx)
    assert result.status is Status.FAIL and "replica 1 wants GPU 4, this host has 4 (0, 1, 2, 3)" in result.reason
    ctx = Context(profile, model=None, package=None)
    ctx.gpus = _scan(8)
    assert replica_sets(ctx).status is Status.PASS


def test_preflight_router_needs_the_package(tmp_path: Path) -> None:
    ctx = Context(load_profile("cpu-tiny-replicas"), model=None, package=None)
    assert router(ctx).status is Status.PASS
    bare = tmp_path / "bare"  # an interpreter without vllm-router
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(bare)], check=True, timeout=120)
    missing = Context(load_profile("cpu-tiny-replicas"), model=None, package=None, python=str(bare / "bin/python"))
    result = router(missing)
    assert result.status is Status.FAIL and "vllm_router is not importable" in result.reason
