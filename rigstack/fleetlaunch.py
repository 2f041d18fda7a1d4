"""Start a fleet (rigstack.fleets): every member's engines and its vllm-router, one after another as replicas are,
then the gateway (rigstack.gateway) on the public port; stop it gateway first. Beside rigstack.replicas, over the
same serving layer (rigstack.serving).

API:
    fleet_run_dir(name) -> Path: where a fleet's records live by default (the cache's run/fleets/NAME).
    fleet_units(fleet, run_dir) -> list[tuple[Profile, list[Unit]]]: each pool's engines then its router, in
        run_dir/pool-I (replica-N below it for replicas, router/ for the router).
    serve_fleet(name, *, run_dir=None, dry_run=False, force=False, python=sys.executable, on_event) -> int
        Load the fleet, refuse when any of its units already runs, run the fleet's preflight (refuse on FAIL
        unless force), start the pools in order, write the gateway's config, start the gateway. On failure it
        ends what it started, the gateway first. --dry-run reports every command instead, runnable as printed.
    stop_fleet(name, *, run_dir=None, on_event) -> int: the gateway, then each pool (its router first).
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from pathlib import Path

from rigstack.errors import UserError
from rigstack.fleets import Fleet, load_fleet
from rigstack.gateway import GATEWAY_DIR, gateway_unit, setup_command, write_files
from rigstack.launch import planned_units, stop_all
from rigstack.preflight.fleet import FleetReport, fleet_preflight
from rigstack.preflight.runner import EXIT_FAIL
from rigstack.profiles import Profile
from rigstack.replicas import with_router
from rigstack.serving.events import DryRun, Forced, OnEvent, Serving, Stopped, quiet
from rigstack.serving.process import end, refuse_if_serving, stop
from rigstack.serving.ready import launch, launch_units
from rigstack.serving.runrecord import DEFAULT_RUN_DIR, RunRecord
from rigstack.serving.unit import Unit, format_command

GATEWAY_TIMEOUT_S = 600  # LiteLLM's proxy imports for about 20 s on an idle box, minutes on a loaded one


@dataclass(frozen=True)
class GatewayReady:
    """The gateway answers on the public port and routes these model names."""

    url: str
    served: list[str]
    record: RunRecord


@dataclass(frozen=True)
class FleetPreflighted:
    """The fleet's preflight ran before the launch: its report, for the screen."""

    report: FleetReport


def fleet_run_dir(name: str) -> Path:
    return DEFAULT_RUN_DIR / "fleets" / Path(name).stem


def pool_dir(run_dir: Path, index: int) -> Path:
    return run_dir / f"pool-{index}"


def fleet_units(fleet: Fleet, run_dir: Path, python: str = sys.executable,
                build: bool = True) -> list[tuple[Profile, list[Unit]]]:
    pools = []
    for index, pool in enumerate(fleet.pools):
        folder = pool_dir(run_dir, index)
        pools.append((pool, with_router(pool, planned_units(pool, None, folder, build), folder, python=python)))
    return pools


def stop_hint(fleet: Fleet, run_dir: Path) -> str:
    hint = f"rigstack stop --fleet {fleet.name}"
    return hint if run_dir == fleet_run_dir(fleet.name) else f"{hint} --run-dir {run_dir}"


def dry_run_commands(fleet: Fleet, run_dir: Path, python: str = sys.executable) -> str:
    gateway = gateway_unit(fleet, run_dir)
    blocks = [format_command(unit.argv, unit.env) for _, units in fleet_units(fleet, run_dir, python, build=False)
              for unit in units]
    return "\n\n".join([*blocks, setup_command(fleet, run_dir), format_command(gateway.argv, gateway.env)])


def _preflight(fleet: Fleet, force: bool, on_event: OnEvent) -> None:
    report = fleet_preflight(fleet)
    on_event(FleetPreflighted(report))
    if report.code == EXIT_FAIL:
        if not force:
            raise UserError(f"preflight failed for fleet {fleet.name} (FAIL lines above); fix them, or "
                            f"`rigstack serve --fleet {fleet.name} --force` to start anyway", exit_code=EXIT_FAIL)
        on_event(Forced())


def _gateway_key(fleet: Fleet) -> str | None:
    """The key a keyed gateway demands (its readiness is probed with it); refused by name, before anything starts,
    when the variable is unset: LiteLLM would start without a master key and every probe would fail."""
    name = fleet.gateway.api_key_env
    if name is None:
        return None
    key = os.environ.get(name)
    if not key:
        raise UserError(f"fleet {fleet.name}: gateway.api_key_env names {name}, which is not set here; export it "
                        f"(the key clients will send) and rerun; nothing was started")
    return key


def serve_fleet(name: str, *, run_dir: Path | None = None, dry_run: bool = False, force: bool = False,
                python: str = sys.executable, on_event: OnEvent = quiet) -> int:
    fleet = load_fleet(name)
    run_dir = run_dir or fleet_run_dir(fleet.name)
    if dry_run:
        on_event(DryRun(dry_run_commands(fleet, run_dir, python)))
        return 0
    key = _gateway_key(fleet)
    pools = fleet_units(fleet, run_dir, python)
    gateway = gateway_unit(fleet, run_dir)
    hint = stop_hint(fleet, run_dir)
    for unit in [*(unit for _, units in pools for unit in units), gateway]:
        refuse_if_serving(unit.run_dir, hint)
    _preflight(fleet, force, on_event)
    started: list[RunRecord] = []
    try:
        for pool, units in pools:
            launch_units(units, pool.model.served_name, pool.health_timeout_s, started, on_event)
        write_files(fleet, run_dir)
        launched = launch(gateway.argv, gateway.env, gateway.run_dir, url=gateway.url,
                          served_name=fleet.served_names[0], timeout_s=GATEWAY_TIMEOUT_S, on_event=on_event,
                          api_key=key)
        started.append(launched.record)
    except BaseException:
        for record in reversed(started):  # the gateway first, then each pool from its router down
            end(record, on_event=on_event)
        raise
    on_event(GatewayReady(gateway.url, fleet.served_names, launched.record))
    on_event(Serving(hint))
    return 0


def stop_fleet(name: str, *, run_dir: Path | None = None, on_event: OnEvent = quiet) -> int:
    """By the records alone (the fleet file may have changed since): the gateway, then every pool."""
    run_dir = run_dir or fleet_run_dir(name)
    stopped = int(stop(run_dir / GATEWAY_DIR, on_event=on_event))
    stopped += sum(stop_all(folder, on_event) for folder in sorted(run_dir.glob("pool-*")))
    if not stopped:
        raise UserError(f"no running server of fleet {Path(name).stem} is recorded in {run_dir}; pass the "
                        "--run-dir it was started with")
    on_event(Stopped(stopped, run_dir))
    return 0
