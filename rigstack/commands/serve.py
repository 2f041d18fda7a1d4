"""Start a profile's vLLM server (preflight first), wait until it answers, and stop it later.

    rigstack serve --profile NAME [--model PATH] [--run-dir DIR] [--dry-run] [--force]
    rigstack stop [--run-dir DIR]
    python scripts/run_prod.py ... and python scripts/run_prod.py stop ...: the same, as the seeds type them
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from rigstack.launch import DEFAULT_RUN_DIR, serve_profile, stop_run
from rigstack.output.launch import LaunchView
from rigstack.profiles import DEFAULT_PROFILE

app = typer.Typer(add_completion=False, help=__doc__.splitlines()[0])
RunDirOpt = Annotated[Path, typer.Option(help="where the pid record and server.log live")]


ProfileOpt = Annotated[str, typer.Option("--profile", "-p", help="profile name or YAML path")]
ModelOpt = Annotated[Path | None, typer.Option(help="model folder, instead of the profile's")]
DryRunOpt = Annotated[bool, typer.Option("--dry-run", help="print the launch as a shell command; start nothing")]
ForceOpt = Annotated[bool, typer.Option("--force", help="start even when preflight fails")]


def serve(profile: ProfileOpt = DEFAULT_PROFILE, model: ModelOpt = None, run_dir: RunDirOpt = DEFAULT_RUN_DIR,
          dry_run: DryRunOpt = False, force: ForceOpt = False) -> int:
    """Start a profile's server (preflight first) and wait until it answers."""
    return serve_profile(profile, run_dir=run_dir, model=model, dry_run=dry_run, force=force, on_event=LaunchView())


def stop(run_dir: RunDirOpt = DEFAULT_RUN_DIR) -> int:
    """End the server that run_prod started (SIGTERM to its process group, SIGKILL after 30 s)."""
    return stop_run(run_dir, LaunchView())


@app.callback(invoke_without_command=True)
def main(ctx: typer.Context, profile: ProfileOpt = DEFAULT_PROFILE, model: ModelOpt = None,
         run_dir: RunDirOpt = DEFAULT_RUN_DIR, dry_run: DryRunOpt = False, force: ForceOpt = False) -> None:
    # run_prod.py's own form: options without a subcommand serve.
    if ctx.invoked_subcommand is None:
        raise typer.Exit(serve(profile, model, run_dir, dry_run, force))


app.command("stop")(stop)
