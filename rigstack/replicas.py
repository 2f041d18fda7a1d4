"""Replicas behind vllm-router (seed 004): the router as one more unit after the replicas, on the public port.

API:
    with_router(profile, units, run_dir, *, python=sys.executable) -> list[Unit]
        The replica units, each with its own compilation caches, then (when the profile has `router:`) the router
        unit in run_dir/router, pointed at every replica's URL. rigstack.launch starts them in that order, each
        once the one before answers, and `stop` ends all of them.
    router_argv(profile, worker_urls, *, python=sys.executable) -> list[str]: `python -m vllm_router.launch_router`
        with the profile's policy and health checks, and retries that outlast a dead replica's detection.
    compose_router(profile, replica_services) -> dict: the router as a compose service after the replicas.
    public_ports(profile) -> list[int]: every port the profile listens on (replicas, router, its metrics).
vllm-router routes among workers that serve one model; it does not route by model name (see README, "Replicas").
"""

from __future__ import annotations

import math
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

from rigstack.cache import cache_dir
from rigstack.profiles import Profile, Router
from rigstack.serving.unit import Unit, probe_url

ROUTER_DIR = "router"
ROUTER_MODULE = "vllm_router.launch_router"
CACHE_VARS = ("VLLM_CACHE_ROOT", "TRITON_CACHE_DIR")  # vLLM's compile cache, Triton's kernels
STARTUP_CHECK_S = 1  # the router polls the workers at start-up every 30 s by default; they are already up


def replica_caches(profile: Profile, replica: int) -> dict[str, str]:
    """Each replica compiles into its own folders (two loading at once must not share a half-written cache); a
    profile's own VLLM_CACHE_ROOT becomes the parent of the replicas' ones."""
    root = Path(profile.env["VLLM_CACHE_ROOT"]) if "VLLM_CACHE_ROOT" in profile.env else \
        cache_dir() / "compile" / profile.name
    folder = root / f"replica-{replica}"
    return {"VLLM_CACHE_ROOT": str(folder / "vllm"), "TRITON_CACHE_DIR": str(folder / "triton")}


RETRY_FIRST_MS = 100  # the router doubles its wait after each failed try
BREAKER_FAILURES = 2  # consecutive failures after which the router stops picking a worker (its default is 10)


def retry_flags(router: Router) -> list[str]:
    """A request on a replica that dies is tried again until the health checks have taken the replica out of
    rotation (interval x failure threshold, twice over), so a crash loses no request; meanwhile the circuit breaker
    skips the dead replica after two failures. vllm-router's defaults (5 tries from 50 ms, x1.5: 0.66 s in all)
    give up before a 1 s x 2 health check notices, and cache_aware sends every retry back to the dead replica.
    The breaker reopens for a trial after that same window: by then the health checks hold a dead replica out, and
    a restarted one gets traffic once healthy (the router's 60 s default kept a replica back 30 s beyond its boot)."""
    window_ms = 2 * router.health_check_interval_s * router.health_failure_threshold * 1000
    tries = math.ceil(math.log2(window_ms / RETRY_FIRST_MS + 1)) + 1  # n tries wait 100 x (2^(n-1) - 1) ms
    return ["--retry-max-retries", str(tries), "--retry-initial-backoff-ms", str(RETRY_FIRST_MS),
            "--retry-backoff-multiplier", "2", "--cb-failure-threshold", str(BREAKER_FAILURES),
            "--cb-timeout-duration-secs", str(math.ceil(window_ms / 1000))]


def router_flags(profile: Profile, worker_urls: list[str], host: str) -> list[str]:
    router = profile.router
    assert router is not None
    return ["--host", host, "--port", str(router.port), "--worker-urls", *worker_urls,
            "--policy", router.policy,
            "--health-check-interval-secs", str(router.health_check_interval_s),
            "--health-failure-threshold", str(router.health_failure_threshold),
            "--health-success-threshold", str(router.health_success_threshold),
            "--balance-abs-threshold", str(router.balance_abs_threshold),
            "--prometheus-host", "127.0.0.1", "--prometheus-port", str(router.metrics_port),
            "--worker-startup-timeout-secs", str(profile.health_timeout_s),
            "--worker-startup-check-interval", str(STARTUP_CHECK_S), *retry_flags(router)]


def router_argv(profile: Profile, worker_urls: list[str], *, python: str = sys.executable) -> list[str]:
    return [python, "-m", ROUTER_MODULE, *router_flags(profile, worker_urls, profile.host)]


def with_router(profile: Profile, units: list[Unit], run_dir: Path, *, python: str = sys.executable) -> list[Unit]:
    if profile.parallel.replicas > 1:
        units = [replace(unit, env={**unit.env, **replica_caches(profile, replica)}) if not unit.container else unit
                 for replica, unit in enumerate(units)]
    if profile.router is None:
        return units
    argv = router_argv(profile, [unit.url for unit in units], python=python)
    return [*units, Unit(run_dir / ROUTER_DIR, argv, {}, probe_url(profile.host, profile.router.port))]


def compose_router(profile: Profile, replica_services: list[str]) -> dict[str, Any]:
    """The router service: the units' image (it must hold vllm-router), started once every replica is healthy."""
    router = profile.router
    assert router is not None and profile.image
    urls = [f"http://{name}:{profile.port + replica}" for replica, name in enumerate(replica_services)]
    return {
        "image": profile.image,
        "entrypoint": ["python3", "-m", ROUTER_MODULE],
        "command": router_flags(profile, urls, "0.0.0.0"),
        "ports": [f"{profile.host}:{router.port}:{router.port}"],
        "depends_on": {name: {"condition": "service_healthy"} for name in replica_services},
    }


def public_ports(profile: Profile) -> list[int]:
    ports = [profile.port + replica for replica in range(profile.parallel.replicas)]
    if profile.router is not None:
        ports += [profile.router.port, profile.router.metrics_port]
    return ports
