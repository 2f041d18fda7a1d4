"""Start a profile's vLLM server (preflight first), wait until it answers, and stop it later; or a whole fleet.

    rigstack serve --profile NAME [--model PATH] [--run-dir DIR] [--dry-run] [--force]
    rigstack serve --fleet NAME [--run-dir DIR] [--dry-run] [--force]   every member's pool, then the gateway
    rigstack stop [--run-dir DIR] | rigstack stop --fleet NAME [--run-dir DIR]
    python scripts/run_prod.py ... and python scripts/run_prod.py stop ...: the same, as the seeds type them
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from rigstack.errors import UserError
from rigstack.interpreter import in_serving_python, option_words
from rigstack.launch import serve_profile, stop_run
from rigstack.output.launch import LaunchView
from rigstack.profiles import DEFAULT_PROFILE, load_profile
from rigstack.serving.runrecord import DEFAULT_RUN_DIR

app = typer.Typer(add_completion=False, help=__doc__.splitlines()[0])
RunDirOpt = Annotated[Path | None, typer.Option(help="where the pid records and logs live (default: the cache's "
                                                     "run/, or run/fleets/NAME for a fleet)")]


ProfileOpt = Annotated[str, typer.Option("--profile", "-p", help="profile name or YAML path")]
FleetOpt = Annotated[str | None, typer.Option("--fleet", help="fleet name (fleets/) or YAML path: several profiles "
                                                              "behind one gateway, instead of --profile")]
ModelOpt = Annotated[Path | None, typer.Option(help="model folder, instead of the profile's")]
DryRunOpt = Annotated[bool, typer.Option("--dry-run", help="print the launch as shell commands; start nothing")]
ForceOpt = Annotated[bool, typer.Option("--force", help="start even when preflight fails")]


def serve(profile: ProfileOpt = DEFAULT_PROFILE, model: ModelOpt = None, run_dir: RunDirOpt = None,
          dry_run: DryRunOpt = False, force: ForceOpt = False, fleet: FleetOpt = None) -> int:
    """Start a profile's server, or a fleet's pools and gateway (preflight first), and wait until they answer."""
    if fleet is not None:
        from rigstack.fleetlaunch import serve_fleet
        from rigstack.fleets import load_fleet

        if model is not None:
            raise UserError("--model names one model folder; a fleet's members name theirs (drop --model)")
        rerun = in_serving_python(["serve", "--fleet", fleet, *option_words(run_dir=run_dir, dry_run=dry_run,
                                                                            force=force)], *load_fleet(fleet).pools)
        if rerun is not None:
            return rerun
        return serve_fleet(fleet, run_dir=run_dir, dry_run=dry_run, force=force, on_event=LaunchView())
    rerun = in_serving_python(["serve", "--profile", profile, *option_words(
        model=model, run_dir=run_dir, dry_run=dry_run, force=force)], load_profile(profile))
    if rerun is not None:
        return rerun
    if load_profile(profile).hosts:
        from rigstack.multinode import serve_hosts  # one engine across hosts on Ray

        return serve_hosts(profile, run_dir=run_dir or DEFAULT_RUN_DIR, model=model, dry_run=dry_run,
                           on_event=LaunchView())
    return serve_profile(profile, run_dir=run_dir or DEFAULT_RUN_DIR, model=model, dry_run=dry_run, force=force,
                         on_event=LaunchView())


def stop(run_dir: RunDirOpt = None, fleet: FleetOpt = None) -> int:
    """End what run_prod started (SIGTERM to each process group, SIGKILL after 30 s); a fleet's gateway first."""
    if fleet is not None:
        from rigstack.fleetlaunch import stop_fleet

        return stop_fleet(fleet, run_dir=run_dir, on_event=LaunchView())
    return stop_run(run_dir or DEFAULT_RUN_DIR, LaunchView())


@app.callback(invoke_without_command=True)
def main(ctx: typer.Context, profile: ProfileOpt = DEFAULT_PROFILE, model: ModelOpt = None,
         run_dir: RunDirOpt = None, dry_run: DryRunOpt = False, force: ForceOpt = False,
         fleet: FleetOpt = None) -> None:
    # run_prod.py's own form: options without a subcommand serve.
    if ctx.invoked_subcommand is None:
        raise typer.Exit(serve(profile, model, run_dir, dry_run, force, fleet))


app.command("stop")(stop)
