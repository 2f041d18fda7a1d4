"""A profile on this host, end to end (scripts/run_prod.py): its server, or its replicas behind vllm-router
(rigstack.replicas), started over the serving layer (rigstack.serving) after preflight, and stopped by their records.
Beside it on the same layer: one engine across hosts (rigstack.multinode) and a fleet (rigstack.fleetlaunch).

API:
    planned_units(profile, model, run_dir) -> list[Unit]: `docker run` when the profile names an image, else the
        server on this host; replicas get run_dir/replica-N.
    serve_profile(profile_name, *, run_dir, model=None, dry_run=False, force=False, on_event) -> int
        load the profile, render it (rigstack.render), refuse when a server of run_dir already runs, run preflight
        (its report goes to on_event; refuse on FAIL unless force), launch, wait. On failure it stops only what it
        started.
    stop_all(run_dir, on_event) -> int; stop_run(run_dir, on_event) -> int   (`run_prod.py stop`)

Nothing here writes to the terminal: what a person watches is reported as events (rigstack.serving.events, and
Preflighted here) to the on_event callable the command passes in; rigstack/output/launch.py renders them.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from rigstack import render
from rigstack.errors import UserError
from rigstack.invocation import command
from rigstack.preflight.runner import EXIT_FAIL, PreflightReport, preflight
from rigstack.profiles import Profile, load_profile, model_dir
from rigstack.replicas import ROUTER_DIR, with_router
from rigstack.serving.events import DryRun, Forced, OnEvent, Serving, Stopped, quiet
from rigstack.serving.process import STOP_HINT, end, refuse_if_serving, stop
from rigstack.serving.ready import launch_units
from rigstack.serving.unit import Unit, format_command, probe_url
from rigstack.serving.runrecord import DEFAULT_RUN_DIR, RunRecord


@dataclass(frozen=True)
class Preflighted:
    """Preflight ran before the launch: its report, for the screen."""

    report: PreflightReport


def planned_units(profile: Profile, model: Path | None, run_dir: Path, build: bool = True) -> list[Unit]:
    """`docker run` when the profile names an image, else the server on this host; replicas get run_dir/replica-N.
    build=False (a dry run): a tiny model is named where it would be, not built."""
    model = model or (None if build else model_dir(profile.model, build=False))
    units = []
    for replica in range(profile.parallel.replicas):
        folder = run_dir if profile.parallel.replicas == 1 else run_dir / f"replica-{replica}"
        url = probe_url(profile.host, profile.port + replica)
        if profile.image:
            container = f"rigstack-{profile.name}-{replica}"
            argv = render.docker_run(profile, model=model, replica=replica, name=container)
            units.append(Unit(folder, argv, {}, url, container, profile.name))
        else:
            command = render.serve_command(profile, model=model, replica=replica)
            units.append(Unit(folder, command.argv, command.env, url, profile=profile.name))
    return units


def serve_profile(profile_name: str, *, run_dir: Path = DEFAULT_RUN_DIR, model: Path | None = None,
                  dry_run: bool = False, force: bool = False, on_event: OnEvent = quiet) -> int:
    """Preflight, then start the profile's server(s) and wait for each; they keep running after this returns.
    Replicas start one after another, each once the one before answers (they must not load at the same time)."""
    profile = load_profile(profile_name)
    if profile.hosts:
        raise UserError(f"profile {profile.name} spans hosts (hosts:), which rigstack.multinode.serve_hosts starts; "
                        f"`python scripts/run_prod.py --profile {profile_name}` picks it")
    units = with_router(profile, planned_units(profile, model, run_dir, build=not dry_run), run_dir)
    if dry_run:
        on_event(DryRun("\n\n".join(format_command(unit.argv, unit.env) for unit in units)))
        return 0
    stop_hint = STOP_HINT + ("" if run_dir == DEFAULT_RUN_DIR else f" --run-dir {run_dir}")
    for unit in units:
        refuse_if_serving(unit.run_dir, stop_hint)
    report = preflight(profile_name, model=model)
    on_event(Preflighted(report))
    if report.code == EXIT_FAIL:
        if not force:
            raise UserError(f"preflight failed for profile {profile.name} (FAIL lines above); fix them, or "
                            f"`{command(f'serve --profile {profile_name} --force')}` to start anyway",
                            exit_code=EXIT_FAIL)
        on_event(Forced())
    started: list[RunRecord] = []
    try:
        launch_units(units, profile.model.served_name, profile.health_timeout_s, started, on_event)
    except BaseException:
        for record in started:  # a half-started set of replicas is no use; what others started is not ours
            end(record, on_event=on_event)
        raise
    on_event(Serving(stop_hint))
    return 0


def stop_all(run_dir: Path, on_event: OnEvent = quiet) -> int:
    """Stop the router, the server recorded in run_dir and those in its replica-N folders; how many were running.
    The router goes first, so that no request is sent to a replica being stopped."""
    folders = [run_dir / ROUTER_DIR, run_dir, *sorted(run_dir.glob("replica-*")), *sorted(run_dir.glob("ray-*"))]
    return sum(stop(folder, on_event=on_event) for folder in folders)


def stop_run(run_dir: Path = DEFAULT_RUN_DIR, on_event: OnEvent = quiet) -> int:
    stopped = stop_all(run_dir, on_event)
    if stopped:
        on_event(Stopped(stopped, run_dir))
        return 0
    raise UserError(f"no running server is recorded in {run_dir}; pass the --run-dir it was started with")
