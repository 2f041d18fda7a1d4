"""A profile rendered as data: the `vllm serve` argv + env, a `docker run` argv, a compose file. Never a shell string.

API (what the launcher uses):
    serve_command(profile: Profile, *, model: Path | None = None, port: int | None = None, replica: int = 0,
                  python: str = sys.executable) -> ServeCommand
        ServeCommand(argv: list[str], env: dict[str, str]), a frozen dataclass.
        argv = [python, "-m", "vllm.entrypoints.openai.api_server", "--model", <model dir>,
                "--served-model-name", <name>, "--host", <host>, "--port", <port>, <flags...>]
        `model` overrides the profile's model path (preflight/run_prod --model), `port` the profile's port.
        `replica` picks one unit of a replicas profile (port + replica, its own GPUs). env holds ONLY what the
        profile sets (its env:, VLLM_PP_LAYER_PARTITION from the partition, CUDA_VISIBLE_DEVICES for a replica);
        overlay it on os.environ.
    docker_run(profile: Profile, *, model: Path | None = None, replica: int = 0, name: str | None = None) -> list[str]
        ["docker", "run", "--rm", "--name", ..., "--gpus", ..., "-e", "K=V", ..., "-v", "host:container:ro", ...,
         "--entrypoint", "python3", profile.image, "-m", "vllm.entrypoints.openai.api_server", ...]
        Raises UserError when the profile names no image.
    compose(profile: Profile, *, model: Path | None = None) -> dict   (yaml.safe_dump it): one service per replica,
        and a `router` service after them when the profile has `router:` (rigstack.replicas).
Profiles come from rigstack.profiles.load_profile(name_or_path) -> Profile (frozen pydantic model); the fields the
launcher needs: profile.name, .port, .health_timeout_s, .image, .model.served_name, .flavour ("gpu"|"cpu").
Model paths: profile.model.path is a host path, or "tiny:dense" / "tiny:moe" which rigstack.profiles.model_dir()
resolves through rigstack.tinymodel.build_tiny_model(kind).
Preflight locates the tiny model with model_dir(weights, build=False) (rigstack.tinymodel.tiny_model_dir: no torch
import, no build); serve_command/docker_run/compose call model_dir(...) which builds it on first use.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rigstack.errors import UserError
from rigstack.profiles import Profile, model_dir

# The module form needs no console-script metadata, so it also runs a package laid over a plain folder.
SERVER_MODULE = "vllm.entrypoints.openai.api_server"


@dataclass(frozen=True)
class ServeCommand:
    argv: list[str]
    env: dict[str, str] = field(default_factory=dict)


def off_flag(name: str) -> str:
    """The flag that turns a switch off, as vLLM 0.34.0 spells it: enable-X/disable-X pairs, else no-X."""
    for on, off in (("enable-", "disable-"), ("disable-", "enable-")):
        if name.startswith(on):
            return off + name.removeprefix(on)
    return f"no-{name}"


def flag_args(flags: dict[str, Any]) -> list[str]:
    """Long flags as argv: true -> --name, false -> its off form (off_flag), a mapping -> compact JSON, a list ->
    several values."""
    args: list[str] = []
    for name, value in flags.items():
        if value is True:
            args.append(f"--{name}")
        elif value is False:
            args.append(f"--{off_flag(name)}")
        elif isinstance(value, dict):
            args += [f"--{name}", json.dumps(value, separators=(",", ":"))]
        elif isinstance(value, list):
            args += [f"--{name}", *(str(item) for item in value)]
        else:
            args += [f"--{name}", str(value)]
    return args


def vllm_flags(profile: Profile) -> dict[str, Any]:
    """The profile's flags plus those it implies: parallel sizes, and the drafter path in the speculative config."""
    flags: dict[str, Any] = {}
    if profile.parallel.tp > 1:
        flags["tensor-parallel-size"] = profile.parallel.tp
    if profile.parallel.pp > 1:
        flags["pipeline-parallel-size"] = profile.parallel.pp
    flags.update(profile.vllm)
    spec = profile.speculative
    if spec is not None and profile.drafter is not None and "model" not in spec:
        flags["speculative-config"] = {**spec, "model": str(model_dir(profile.drafter))}
    return flags


def _check_replica(profile: Profile, replica: int) -> None:
    if not 0 <= replica < profile.parallel.replicas:
        raise UserError(f"profile {profile.name} has {profile.parallel.replicas} replica(s), not replica {replica}; "
                        f"pick 0 to {profile.parallel.replicas - 1}")


def replica_gpus(profile: Profile, replica: int) -> list[int]:
    """Replica i owns parallel.gpu_sets[i], else the i-th run of tp x pp consecutive GPUs (seed 004: pairs 0-1,
    2-3, ...)."""
    if profile.parallel.gpu_sets:
        return list(profile.parallel.gpu_sets[replica])
    per = profile.parallel.gpus_per_replica
    return list(range(replica * per, (replica + 1) * per))


def pinned_gpus(profile: Profile) -> bool:
    """Each unit is given its own cards: replicas, or one engine whose cards are named (a fleet's member on 4-7)."""
    return profile.parallel.replicas > 1 or profile.parallel.gpu_sets is not None


def profile_env(profile: Profile) -> dict[str, str]:
    env = dict(profile.env)
    if profile.partition_env:
        env["VLLM_PP_LAYER_PARTITION"] = profile.partition_env
    offload = profile.offload
    if offload is not None and offload.hot_set is not None:  # patch 0014's per-layer hot-expert cache
        env["VLLM_EXPERT_OFFLOAD"] = offload.hot_set
        if offload.hot_experts_per_layer is not None:
            env["VLLM_EXPERT_OFFLOAD_CACHE"] = str(offload.hot_experts_per_layer)
        if offload.grouped_prefill_min_tokens is not None:
            env["VLLM_EXPERT_OFFLOAD_GROUPED_MIN_TOKENS"] = str(offload.grouped_prefill_min_tokens)
    return env


def _server_args(profile: Profile, model: Path | None, host: str, port: int) -> list[str]:
    return ["--model", str(model or model_dir(profile.model)), "--served-model-name", profile.model.served_name,
            "--host", host, "--port", str(port), *flag_args(vllm_flags(profile))]


def serve_command(profile: Profile, *, model: Path | None = None, port: int | None = None, replica: int = 0,
                  python: str = sys.executable) -> ServeCommand:
    """The server process for one replica, run on this host."""
    _check_replica(profile, replica)
    env = profile_env(profile)
    if pinned_gpus(profile):
        env["CUDA_VISIBLE_DEVICES"] = ",".join(map(str, replica_gpus(profile, replica)))
    port = (port or profile.port) + replica
    return ServeCommand([python, "-m", SERVER_MODULE, *_server_args(profile, model, profile.host, port)], env)


def _mounts(profile: Profile, model: Path | None) -> list[Path]:
    """Weights are mounted read-only at their host path, so the server's argv is the same inside and out."""
    paths = [model or model_dir(profile.model)]
    if profile.drafter is not None:
        paths.append(model_dir(profile.drafter))
    return paths


def _image(profile: Profile) -> str:
    if not profile.image:
        raise UserError(f"profile {profile.name} names no image; run it on the host (drop --docker) or add image:")
    return profile.image


def docker_run(profile: Profile, *, model: Path | None = None, replica: int = 0, name: str | None = None) -> list[str]:
    """`docker run` for one replica. Inside the container the server listens on all interfaces; the published
    port binds to the profile's host address."""
    _check_replica(profile, replica)
    image = _image(profile)
    port = profile.port + replica
    argv = ["docker", "run", "--rm", "--name", name or f"rigstack-{profile.name}-{replica}",
            "--ipc", profile.docker.ipc, "--shm-size", profile.docker.shm_size,
            "-p", f"{profile.host}:{port}:{port}"]
    if profile.flavour == "gpu":
        devices = "all" if not pinned_gpus(profile) else \
            '"device=' + ",".join(map(str, replica_gpus(profile, replica))) + '"'  # docker reads it as CSV
        argv += ["--gpus", devices]
    for key, value in profile_env(profile).items():
        argv += ["-e", f"{key}={value}"]
    if profile.docker.memory:
        argv += ["--memory", profile.docker.memory]
    for path in _mounts(profile, model):
        argv += ["-v", f"{path}:{path}:ro"]
    if profile.docker.bind_package:
        from rigstack.rigimages import bind_mounts  # the same .so and folder guard as a built image

        argv += bind_mounts(Path(profile.docker.bind_package))
    return [*argv, "--entrypoint", "python3", image, "-m", SERVER_MODULE,
            *_server_args(profile, model, "0.0.0.0", port)]


def compose(profile: Profile, *, model: Path | None = None) -> dict[str, Any]:
    """A compose file (as data) with one service per replica, each on its own GPUs and port; every service waits
    for the one before it to be healthy, because replicas should load one after another (seed 004)."""
    image = _image(profile)
    services: dict[str, Any] = {}
    previous = None
    for replica in range(profile.parallel.replicas):
        port = profile.port + replica
        service: dict[str, Any] = {
            "image": image,
            "entrypoint": ["python3", "-m", SERVER_MODULE],
            "command": _server_args(profile, model, "0.0.0.0", port),
            "environment": profile_env(profile),
            "ports": [f"{profile.host}:{port}:{port}"],
            "ipc": profile.docker.ipc,
            "shm_size": profile.docker.shm_size,
            "volumes": [f"{path}:{path}:ro" for path in _mounts(profile, model)],
            "healthcheck": {
                "test": ["CMD", "python3", "-c",
                         f"import urllib.request; urllib.request.urlopen('http://127.0.0.1:{port}/health')"],
                "interval": "30s", "start_period": f"{profile.health_timeout_s}s"},
        }
        if profile.flavour == "gpu":
            devices = [str(gpu) for gpu in replica_gpus(profile, replica)]
            service["deploy"] = {"resources": {"reservations": {"devices": [
                {"driver": "nvidia", "device_ids": devices, "capabilities": ["gpu"]}]}}}
        if previous:
            service["depends_on"] = {previous: {"condition": "service_healthy"}}
        previous = f"{profile.name}-{replica}"
        services[previous] = service
    if profile.router is not None:
        from rigstack.replicas import compose_router  # it imports the launcher, which imports this module

        services["router"] = compose_router(profile, list(services))
    return {"services": services}
