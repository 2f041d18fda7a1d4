"""bench_preflight.py: wall time of a whole preflight run on a profile, median of N fresh processes, vs 2 s.

    python scripts/bench_preflight.py [--profile cpu-tiny] [--runs 5] [-- EXTRA PREFLIGHT ARGS]
"""

from __future__ import annotations

import sys

import typer


from rigstack.cli import run

app = typer.Typer(add_completion=False, help=__doc__.splitlines()[0], pretty_exceptions_enable=False)


@app.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def main(ctx: typer.Context, profile: str = typer.Option("cpu-tiny", help="profile name or YAML path"),
         runs: int = typer.Option(5, min=1, help="timed runs after the first")) -> None:
    from rigstack.output.preflight import show_timing
    from rigstack.preflight.bench import bench_preflight

    show_timing(bench_preflight(profile, runs, list(ctx.args)))


if __name__ == "__main__":
    sys.exit(run(app))
