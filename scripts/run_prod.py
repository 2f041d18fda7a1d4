"""Start a profile's vLLM server (preflight first), wait until it answers, and stop it later.

    python scripts/run_prod.py --profile NAME [--model PATH] [--run-dir DIR] [--dry-run] [--force]
    python scripts/run_prod.py stop [--run-dir DIR]
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from rigstack import cli  # noqa: E402
from rigstack.launch import DEFAULT_RUN_DIR, serve_profile, stop_run  # noqa: E402
from rigstack.profiles import DEFAULT_PROFILE  # noqa: E402

app = typer.Typer(add_completion=False, help=__doc__.splitlines()[0])
RunDirOpt = Annotated[Path, typer.Option(help="where the pid record and server.log live")]


@app.callback(invoke_without_command=True)
def main(ctx: typer.Context,
         profile: Annotated[str, typer.Option("--profile", "-p", help="profile name or YAML path")] = DEFAULT_PROFILE,
         model: Annotated[Path | None, typer.Option(help="model folder, instead of the profile's")] = None,
         run_dir: RunDirOpt = DEFAULT_RUN_DIR,
         dry_run: Annotated[bool, typer.Option("--dry-run",
                                               help="print the launch as a shell command; start nothing")] = False,
         force: Annotated[bool, typer.Option("--force", help="start even when preflight fails")] = False) -> None:
    if ctx.invoked_subcommand is None:
        raise typer.Exit(serve_profile(profile, run_dir=run_dir, model=model, dry_run=dry_run, force=force))


@app.command()
def stop(run_dir: RunDirOpt = DEFAULT_RUN_DIR) -> None:
    """End the server that run_prod started (SIGTERM to its process group, SIGKILL after 30 s)."""
    raise typer.Exit(stop_run(run_dir))


if __name__ == "__main__":
    sys.exit(cli.run(app))
