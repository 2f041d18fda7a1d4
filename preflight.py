"""preflight.py: seconds-long checks of this host, the patched vLLM and the weights against a profile.

    python preflight.py --profile NAME|PATH.yaml [--model PATH] [--package PATH] [--python PATH] [--json] [--strict]
    python preflight.py profiles            every profile, marking those that fit this host's GPUs
    python preflight.py show NAME [--resolved]

Exit 0 when nothing failed, 1 on warnings with --strict, 2 on any FAIL.
"""

from __future__ import annotations

import sys
from pathlib import Path

import typer

from rigstack.cli import run
from rigstack.profiles import DEFAULT_PROFILE

app = typer.Typer(add_completion=False, help=__doc__.splitlines()[0], pretty_exceptions_enable=False)


@app.callback(invoke_without_command=True)
def main(
    ctx: typer.Context,
    profile: str = typer.Option(DEFAULT_PROFILE, "--profile", "-p", help="profile name or YAML path"),
    model: Path | None = typer.Option(None, help="model folder, instead of the profile's path"),
    package: Path | None = typer.Option(None, help="vllm package folder (default: the one python would import)"),
    python: str | None = typer.Option(None, help="the interpreter that serves the package, which imports it for the "
                                      "flag and import checks (default: its venv's python, else this one)"),
    json_out: bool = typer.Option(False, "--json", help="results as JSON on stdout"),
    strict: bool = typer.Option(False, help="exit 1 on warnings"),
) -> None:
    """Check a profile (default: cpu-tiny)."""
    if ctx.invoked_subcommand is None:
        from rigstack.preflight.runner import run_preflight

        raise typer.Exit(run_preflight(profile, model=model, package=package, python=python, as_json=json_out,
                                       strict=strict))


@app.command("profiles")
def profiles(json_out: bool = typer.Option(False, "--json")) -> None:
    """List profiles, marking which fit this host's GPUs."""
    from rigstack.preflight.runner import list_fits

    raise typer.Exit(list_fits(as_json=json_out))


@app.command("show")
def show(name: str, resolved: bool = typer.Option(False, "--resolved", help="merge what it extends")) -> None:
    """Print a profile as written, or resolved."""
    from rigstack.preflight.runner import show as show_profile

    raise typer.Exit(show_profile(name, resolved))


if __name__ == "__main__":
    sys.exit(run(app))
