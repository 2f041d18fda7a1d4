"""Preflight of a fleet: every member's own checks (the pool's profile, with the fleet's GPU sets and ports), then
the fleet's: each pool's cards on this host, every port free, host RAM for all the engines, the gateway's venv."""

from __future__ import annotations

import re
import time
from dataclasses import dataclass, replace
from pathlib import Path

from rigstack.fleets import Fleet, pool_gpus
from rigstack.gateway import LITELLM_VERSION, gateway_venv, installed_version
from rigstack.preflight.core import Result, fail, passed, skip, warn
from rigstack.preflight.hardware import MEMORY_SLACK
from rigstack.preflight.host import meminfo, port_in_use
from rigstack.preflight.nvml import GpuScan, scan
from rigstack.preflight.runner import exit_code, run_checks
from rigstack.profiles import Profile
from rigstack.replicas import public_ports


def pool_cards(fleet: Fleet, gpus: GpuScan) -> Result:
    """Each pool's own cards: present, the profile's kind, big enough (a profile's own check reads the first N)."""
    present = {gpu.index: gpu for gpu in gpus.gpus}
    used = 0
    for index, pool in enumerate(fleet.pools):
        hardware = pool.hardware
        for number in pool_gpus(pool):
            gpu = present.get(number)
            where = f"members.{index} ({pool.name}) wants GPU {number}"
            if gpu is None:
                return fail(f"{where}, this host has {len(present)} ({gpus.problem or 'NVML lists them'})",
                            "fix the member's gpu_sets in the fleet file")
            if hardware.gpu_name and not re.search(hardware.gpu_name, gpu.name, re.IGNORECASE):
                return fail(f"{where}: a {gpu.name}, not a {hardware.gpu_name}", "give the member other cards")
            if hardware.card_gib and gpu.memory_gib < hardware.card_gib * MEMORY_SLACK:
                return fail(f"{where}: it has {gpu.memory_gib:.1f} GiB, the profile needs {hardware.card_gib:.1f}",
                            "give the member other cards, or check the card's VRAM")
            used += 1
    if not used:
        return skip("every member runs on the CPU")
    return passed(f"{used} GPU(s) of {len(present)}, each in one member's sets and fit for its profile")


def ports(fleet: Fleet) -> Result:
    wanted = [(fleet.host, fleet.port, "the gateway")] + [
        (pool.host, port, f"members.{index}") for index, pool in enumerate(fleet.pools) for port in public_ports(pool)]
    busy = next(((port, owner) for host, port, owner in wanted if port_in_use(host, port)), None)
    if busy:
        return fail(f"port {busy[0]} ({busy[1]}) is in use", f"stop what listens there (ss -ltnp 'sport = :{busy[0]}') "
                    "or move it in the fleet file")
    return passed(f"{len(wanted)} ports free: gateway {fleet.port}, engines, routers and their metrics")


def host_ram(fleet: Fleet) -> Result:
    need = sum(pool.hardware.host_ram_gib or 0.0 for pool in fleet.pools)
    if not need:
        return skip("no member gives hardware.host_ram_gib")
    info = meminfo()
    total, available = info.get("MemTotal", 0.0), info.get("MemAvailable", 0.0)
    if total < need:
        return fail(f"the members need {need:g} GiB of host RAM together, this host has {total:.0f}",
                    "lower replicas or run fewer members")
    if available < need:
        return warn(f"{available:.1f} GiB RAM available, the members need {need:g} together",
                    "stop other servers first, or expect swapping")
    return passed(f"{available:.0f} of {total:.0f} GiB RAM available, {need:g} for the members")


def gateway(fleet: Fleet) -> Result:
    venv = gateway_venv()
    version = installed_version(venv)
    if version != LITELLM_VERSION:
        found = f"litellm {version}" if version else "no litellm"
        return fail(f"the gateway venv {venv} has {found}, the fleet runs litellm {LITELLM_VERSION}",
                    "make gateway (or make apply); RIGSTACK_GATEWAY_VENV names another venv")
    return passed(f"litellm {version} in {venv}, on port {fleet.port}")


@dataclass(frozen=True)
class FleetReport:
    fleet: Fleet
    members: list[tuple[Profile, list[Result]]]
    results: list[Result]  # the fleet's own checks
    code: int
    seconds: float

    def to_json(self) -> dict[str, object]:
        return {"fleet": self.fleet.name, "exit_code": self.code,
                "members": [{"profile": profile.name, "served_name": profile.model.served_name,
                             "results": [result.as_json() for result in results]}
                            for profile, results in self.members],
                "results": [result.as_json() for result in self.results]}


def fleet_checks(fleet: Fleet) -> list[Result]:
    checks = (("fleet-gpus", lambda: pool_cards(fleet, scan())), ("fleet-ports", lambda: ports(fleet)),
              ("fleet-ram", lambda: host_ram(fleet)), ("gateway", lambda: gateway(fleet)))
    return [replace(function(), check=name) for name, function in checks]


def fleet_preflight(fleet: Fleet, *, package: Path | None = None, python: str | None = None,
                    strict: bool = False) -> FleetReport:
    start = time.perf_counter()
    members = [(pool, run_checks(pool, package=package, python=python)) for pool in fleet.pools]
    results = fleet_checks(fleet)
    everything = [result for _, checks in members for result in checks] + results
    return FleetReport(fleet, members, results, exit_code(everything, strict), time.perf_counter() - start)
