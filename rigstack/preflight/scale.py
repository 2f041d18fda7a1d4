"""Checks of the scale-out shapes: replicas' GPU sets present on this host, the router installed, and for a profile
across hosts the same stack on every host with the Ray ports open between them."""

from __future__ import annotations

import importlib.util
import subprocess
import sys

from rigstack import multinode
from rigstack.errors import UserError
from rigstack.preflight.core import Context, Result, check, fail, passed, skip
from rigstack.render import replica_gpus
from rigstack.replicas import ROUTER_MODULE

ROUTER_PACKAGE = ROUTER_MODULE.split(".")[0]


@check("replica-gpus")
def replica_sets(ctx: Context) -> Result:
    profile = ctx.profile
    if profile.parallel.replicas == 1:
        return skip("one unit")
    sets = [replica_gpus(profile, replica) for replica in range(profile.parallel.replicas)]
    shown = " ".join(",".join(map(str, gpus)) for gpus in sets)
    if profile.flavour == "cpu":
        return passed(f"{len(sets)} replicas on the CPU")
    present = {gpu.index for gpu in ctx.gpus.gpus}
    for replica, gpus in enumerate(sets):
        missing = [gpu for gpu in gpus if gpu not in present]
        if missing:
            return fail(f"replica {replica} wants GPU {missing[0]}, this host has {len(present)} "
                        f"({', '.join(map(str, sorted(present))) or 'none'})",
                        "lower parallel.replicas or fix parallel.gpu_sets")
    return passed(f"{len(sets)} replicas on disjoint GPU sets {shown}")


def _router_found(python: str | None) -> bool:
    if python is None:
        return importlib.util.find_spec(ROUTER_PACKAGE) is not None
    probe = subprocess.run([python, "-c", f"import {ROUTER_PACKAGE}"], capture_output=True, timeout=60, check=False)
    return probe.returncode == 0


@check("router")
def router(ctx: Context) -> Result:
    if ctx.profile.router is None:
        return skip("no router: in the profile")
    if not _router_found(ctx.python):
        return fail(f"{ROUTER_PACKAGE} is not importable by the serving interpreter",
                    "pip install -r requirements.txt (it pins vllm-router) into the venv that runs the launcher")
    policy = ctx.profile.router.policy
    return passed(f"vllm-router found; policy {policy} on port {ctx.profile.router.port}")


# The tests swap in `ip netns exec`; on the rigs each host is reached over ssh.
REMOTE: multinode.Remote = multinode.ssh


@check("hosts", slow=True)
def hosts(ctx: Context) -> Result:
    profile = ctx.profile
    if not profile.hosts:
        return skip("one host")
    python = ctx.python or sys.executable  # every host runs the serving venv at the same path (multinode.py)
    try:
        multinode.compare_facts(profile, multinode.host_facts(profile, REMOTE, python))
        closed = multinode.closed_ports(profile, REMOTE, python)
    except UserError as error:
        return fail(str(error), "fix that host before the boot: Ray workers that differ fail in ways that name nothing")
    if closed:
        return fail(f"{len(closed)} Ray port(s) closed between hosts: {', '.join(closed[:3])}",
                    "open the profile's ray: ports between the hosts (firewall, security group) or change them")
    addresses = ", ".join(host.address for host in profile.hosts)
    return passed(f"{addresses}: the same vLLM, Ray and stack hash; the fixed Ray ports open between them")
