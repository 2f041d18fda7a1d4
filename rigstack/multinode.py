"""One engine across hosts on Ray: the head on hosts[0], workers joined to it, `vllm serve` on the head.

API:
    Remote = Callable[[Host, list[str]], list[str]]: wraps an argv so that it runs on a host; ssh() is the default,
        the tests pass `ip netns exec NS` instead.
    plan(profile, *, model=None, python="python3", ray=None) -> list[Step]
        Step(host, what, argv, env): the Ray head, each worker (`ray start` on fixed ports, so a firewall can open
        them), then the server on the head with `--distributed-executor-backend ray`. Each host runs its own
        `python:` from the profile, else `python`; its ray is `ray`, else the one beside that python.
    facts_argv(python) -> list[str]: a one-line probe printing the host's vllm and ray versions and stack hash.
    compare_facts(profile, facts) -> None: UserError when a worker's versions or stack hash differ from the head's.
    reach_argv(python, address, port) -> list[str]: the probe a worker runs to reach the head's Ray port.
    closed_ports(profile, remote, python) -> list[str]: each host listens on its fixed Ray ports for a moment while
        every other host connects; "FROM -> TO:PORT" for each connection that failed (preflight's hosts check).
    start_ray(profile, remote, run_dir, *, python, ray, on_event) -> list[RunRecord]
        `ray start --block` per host, each recorded in run_dir/ray-ADDRESS like any server (rigstack.serving), so
        `run_prod.py stop` ends them by process group: ending the blocking `ray start` (or its ssh session) stops
        that host's Ray processes. Never `ray stop`, which ends every Ray process of the machine it runs on.
    serve_hosts(profile_name, *, run_dir, model=None, dry_run=False, remote=ssh, python="python3", ray="ray") -> int
        (scripts/run_prod.py for a profile with hosts:) every host probed and compared first, then Ray, then the
        server on the head, waited for like any other.
"""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from rigstack import render
from rigstack.errors import UserError
from rigstack.profiles import Host, Profile, load_profile
from rigstack.serving.events import DryRun, OnEvent, quiet
from rigstack.serving.process import STOP_HINT, end, refuse_if_serving, running, start
from rigstack.serving.ready import launch
from rigstack.serving.unit import format_command, probe_url
from rigstack.serving.runrecord import DEFAULT_RUN_DIR, RunRecord, log_tail

Remote = Callable[[Host, list[str]], list[str]]
PROBE_TIMEOUT_S = 120
# Printed by every host, compared against the head's: a mismatch makes Ray workers fail in ways that name nothing.
FACTS_CODE = ("import json, importlib.metadata as m, pathlib, vllm\n"
              "stamp = pathlib.Path(vllm.__file__).parent / 'rigstack_stamp.json'\n"
              "print(json.dumps({'vllm': m.version('vllm'), 'ray': m.version('ray'),\n"
              "  'stack_hash': json.loads(stamp.read_text())['stack_hash'] if stamp.is_file() else None}))")
REACH_CODE = "import socket, sys; socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=5).close()"
# Holds a host's Ray ports open while the others connect; it ends itself in case the ssh session outlives us.
LISTEN_CODE = ("import socket, sys, time\n"
               "held = [socket.create_server((sys.argv[1], int(port))) for port in sys.argv[2:]]\n"
               "print('listening', flush=True)\n"
               "time.sleep(60)")


@dataclass(frozen=True)
class Step:
    host: Host
    what: str
    argv: list[str]
    env: dict[str, str] = field(default_factory=dict)


def ssh(host: Host, argv: list[str]) -> list[str]:
    # A host that drops packets would hold the probe for the kernel's connect timeout (about two minutes).
    return ["ssh", "-o", "ConnectTimeout=10", "-o", "BatchMode=yes", host.ssh or host.address, "--", shlex.join(argv)]


def _with_env(argv: list[str], env: dict[str, str]) -> list[str]:
    """The env travels in the command itself: ssh passes no environment, and Ray's workers inherit the raylet's."""
    return ["env", *(f"{key}={value}" for key, value in env.items()), *argv] if env else argv


def _ports(profile: Profile) -> list[str]:
    ray = profile.ray
    return ["--node-manager-port", str(ray.node_manager_port), "--object-manager-port", str(ray.object_manager_port),
            "--min-worker-port", str(ray.min_worker_port), "--max-worker-port", str(ray.max_worker_port)]


def _resources(profile: Profile, host: Host) -> list[str]:
    # On a cpu profile a host's `gpus` are its pipeline stages: one CPU each for Ray to place a worker on.
    return ["--num-cpus", str(host.gpus), "--num-gpus", "0"] if profile.flavour == "cpu" else \
        ["--num-gpus", str(host.gpus)]


def node_env(profile: Profile, host: Host) -> dict[str, str]:
    """vLLM reads its own address from VLLM_HOST_IP: without it a host with two interfaces may pick the wrong one."""
    return {**render.profile_env(profile), "VLLM_HOST_IP": host.address}


def host_python(host: Host, python: str) -> str:
    """The serving interpreter on a host: its own from the profile, else the launch's."""
    return host.python or python


def _ray(host: Host, python: str, ray: str | None) -> str:
    return ray or str(Path(host_python(host, python)).parent / "ray")


def plan(profile: Profile, *, model: Path | None = None, python: str = "python3", ray: str | None = None) -> list[Step]:
    head, *workers = profile.hosts
    steps = [Step(head, "ray head", [_ray(head, python, ray), "start", "--block", "--head", "--node-ip-address",
                                     head.address, "--port", str(profile.ray.port), *_ports(profile),
                                     *_resources(profile, head), "--include-dashboard=false", "--disable-usage-stats"],
                  node_env(profile, head))]
    for host in workers:
        address = f"{head.address}:{profile.ray.port}"
        steps.append(Step(host, "ray worker", [_ray(host, python, ray), "start", "--block", "--address", address,
                                               "--node-ip-address", host.address, *_ports(profile),
                                               *_resources(profile, host), "--disable-usage-stats"],
                          node_env(profile, host)))
    command = render.serve_command(profile, model=model, python=host_python(head, python))
    steps.append(Step(head, "vllm serve", [*command.argv, "--distributed-executor-backend", "ray"],
                      {**command.env, "VLLM_HOST_IP": head.address}))
    return steps


def facts_argv(python: str) -> list[str]:
    return [python, "-c", FACTS_CODE]


def reach_argv(python: str, address: str, port: int) -> list[str]:
    return [python, "-c", REACH_CODE, address, str(port)]


def _run(remote: Remote, host: Host, argv: list[str], what: str) -> str:
    try:
        done = subprocess.run(remote(host, argv), capture_output=True, text=True, timeout=PROBE_TIMEOUT_S,
                              check=False)
    except (OSError, subprocess.TimeoutExpired) as error:
        raise UserError(f"host {host.address}: {what} did not run ({error}); check `ssh {host.ssh or host.address}`")\
            from None
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise UserError(f"host {host.address}: {what} failed (exit {done.returncode}: {last})")
    return done.stdout


def host_ports(profile: Profile, host: Host) -> list[int]:
    """The fixed ports Ray serves on a host: every node's node and object managers, and the head's GCS. The worker
    port range is not probed (a firewall rule opens it as one range)."""
    ray = profile.ray
    ports = [ray.node_manager_port, ray.object_manager_port]
    return [ray.port, *ports] if host == profile.hosts[0] else ports


def closed_ports(profile: Profile, remote: Remote, python: str) -> list[str]:
    closed = []
    for host in profile.hosts:
        ports = host_ports(profile, host)
        listener = subprocess.Popen(remote(host, [host_python(host, python), "-c", LISTEN_CODE, host.address,
                                                  *map(str, ports)]),
                                    stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                    text=True)
        try:
            if "listening" not in (listener.stdout.readline() if listener.stdout else ""):
                listener.kill()
                last = (listener.communicate()[1].strip().splitlines() or ["no output"])[-1]
                raise UserError(f"host {host.address}: cannot listen on its Ray ports {ports} ({last}); a process "
                                "holds one there: stop it or change the profile's ray: ports")
            for other in profile.hosts:
                for port in ports if other != host else ():
                    try:
                        _run(remote, other, reach_argv(host_python(other, python), host.address, port),
                             "the port probe")
                    except UserError:
                        closed.append(f"{other.address} -> {host.address}:{port}")
        finally:
            listener.kill()
            listener.communicate()
    return closed


def host_facts(profile: Profile, remote: Remote, python: str) -> dict[str, dict[str, str | None]]:
    facts = {}
    for host in profile.hosts:
        out = _run(remote, host, facts_argv(host_python(host, python)), "the version probe")
        try:
            facts[host.address] = json.loads(out.strip().splitlines()[-1])
        except (ValueError, IndexError):
            raise UserError(f"host {host.address}: the version probe printed {out[-200:]!r}, not its JSON; is "
                            f"{host_python(host, python)} the serving venv's interpreter there? (name it as the "
                            "host's python: in the profile's hosts:)") from None
    return facts


def compare_facts(profile: Profile, facts: dict[str, dict[str, str | None]]) -> None:
    head = profile.hosts[0].address
    for host in profile.hosts[1:]:
        for key in ("vllm", "ray", "stack_hash"):
            mine, theirs = facts[head].get(key), facts[host.address].get(key)
            if mine != theirs:
                raise UserError(f"host {host.address}: {key} is {theirs}, the head {head} has {mine}; install the same "
                                "stack on every host (python apply.py apply, the same versions.env)")


NODES_CODE = ("import ray, sys; ray.init(address=sys.argv[1], logging_level='ERROR'); "
              "print(sum(node['Alive'] for node in ray.nodes()))")
JOIN_TIMEOUT_S = 180


def _alive_nodes(profile: Profile, remote: Remote, python: str) -> int:
    head = profile.hosts[0]
    try:
        out = _run(remote, head, [host_python(head, python), "-c", NODES_CODE, f"{head.address}:{profile.ray.port}"],
                   "the Ray probe")
        return int(out.strip().splitlines()[-1])
    except (UserError, ValueError, IndexError):
        return 0


def _wait_nodes(profile: Profile, remote: Remote, python: str, want: int, records: list[RunRecord]) -> None:
    began = time.monotonic()
    while _alive_nodes(profile, remote, python) < want:
        for record in records:
            if not running(Path(record.log).parent):
                raise UserError(f"`ray start` exited on its host (log: {record.log}): "
                                f"{log_tail(Path(record.log), 1) or 'no output'}")
        if time.monotonic() - began > JOIN_TIMEOUT_S:
            raise UserError(f"the Ray cluster has fewer than {want} live node(s) after {JOIN_TIMEOUT_S} s; read "
                            f"{records[-1].log}")
        time.sleep(1.0)


def start_ray(profile: Profile, remote: Remote, run_dir: Path, *, python: str = "python3",
              ray: str | None = None, on_event: OnEvent = quiet) -> list[RunRecord]:
    """The head, then each worker once it reaches the head's port (a closed firewall fails here, named), each
    waited for until the cluster counts it. On failure what was started is ended."""
    head = profile.hosts[0]
    records: list[RunRecord] = []
    try:
        for count, step in enumerate(plan(profile, python=python, ray=ray)[:-1], start=1):
            if step.what == "ray worker":
                _run(remote, step.host, reach_argv(host_python(step.host, python), head.address, profile.ray.port),
                     f"reaching the Ray head at {head.address}:{profile.ray.port} (open the Ray ports between hosts)")
            _, record = start(remote(step.host, _with_env(step.argv, step.env)), {},
                              run_dir / f"ray-{step.host.address}",
                              url=f"http://{step.host.address}:{profile.ray.port}", served_name=step.what,
                              check_port=False)
            records.append(record)
            _wait_nodes(profile, remote, python, count, records)
    except BaseException:
        for record in reversed(records):
            end(record, on_event=on_event)
        raise
    return records


def dry_run_text(profile: Profile, remote: Remote, *, model: Path | None, python: str, ray: str | None,
                 whose: str) -> str:
    """Each host's commands, headed by the interpreter it runs and where that came from (`whose`: the launch's)."""
    blocks = []
    for step in plan(profile, model=model, python=python, ray=ray):
        source = "the profile's python: for this host" if step.host.python else whose
        blocks.append(f"# on {step.host.address}: {step.what} (python {host_python(step.host, python)}: {source})\n"
                      + format_command(remote(step.host, _with_env(step.argv, step.env)), {}))
    return "\n\n".join(blocks)


def serve_hosts(profile_name: str, *, run_dir: Path = DEFAULT_RUN_DIR, model: Path | None = None,
                dry_run: bool = False, remote: Remote = ssh, python: str = sys.executable,
                ray: str | None = None, on_event: OnEvent = quiet) -> int:
    """A host without its own python: runs the same venv at the same path as this one, the serving interpreter
    (rigstack.interpreter reruns the launch there from the tool's venv); the stamp check proves it is the same stack."""
    profile = load_profile(profile_name)
    if not profile.hosts:
        raise UserError(f"profile {profile.name} lists no hosts:; start it with scripts/run_prod.py")
    if dry_run:
        whose = "the launch's own, as the profile names none for this host"
        on_event(DryRun(dry_run_text(profile, remote, model=model, python=python, ray=ray, whose=whose)))
        return 0
    refuse_if_serving(run_dir, f"{STOP_HINT} --run-dir {run_dir}")
    compare_facts(profile, host_facts(profile, remote, python))
    records = start_ray(profile, remote, run_dir, python=python, ray=ray, on_event=on_event)
    serve = plan(profile, model=model, python=python, ray=ray)[-1]
    try:
        launch(remote(serve.host, _with_env(serve.argv, serve.env)), {}, run_dir,
                      url=probe_url(serve.host.address, profile.port),
                      served_name=profile.model.served_name, timeout_s=profile.health_timeout_s, on_event=on_event)
    except BaseException:
        for record in reversed(records):
            end(record, on_event=on_event)
        raise
    return 0
