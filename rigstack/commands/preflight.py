"""Seconds-long checks of this host, the patched vLLM and the weights against a profile.

    python preflight.py --profile NAME|PATH.yaml [--model PATH] [--package PATH] [--python PATH] [--json] [--strict]
    python preflight.py --fleet NAME|PATH.yaml [--package PATH] [--python PATH] [--json] [--strict]
    python preflight.py profiles            every profile, marking those that fit this host's GPUs
    python preflight.py show NAME [--resolved]
    python preflight.py plan --profile NAME [--pp N] [--tp N] [--partition a,b,...] [--util F] [--max-model-len N]
                             [--max-num-seqs N] [--search] [--json]    vLLM's KV pool per stage; does it start

Exit 0 when nothing failed, 1 on warnings with --strict, 2 on any FAIL.
"""

from __future__ import annotations

from pathlib import Path

import typer

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
    fleet: str | None = typer.Option(None, "--fleet", help="check a fleet (fleets/ name or YAML path): every "
                                     "member's checks, then its GPU sets, ports, RAM and gateway"),
) -> None:
    """Check a profile (default: cpu-tiny), or a fleet."""
    if ctx.invoked_subcommand is None and fleet is not None:
        from rigstack.fleets import load_fleet
        from rigstack.interpreter import in_serving_python, option_words
        from rigstack.output.preflight import print_fleet_report
        from rigstack.preflight.fleet import fleet_preflight

        if package is None and python is None:
            rerun = in_serving_python(["preflight", "--fleet", fleet, *option_words(json=json_out, strict=strict)],
                                      *load_fleet(fleet).pools)
            if rerun is not None:
                raise typer.Exit(rerun)
        fleet_report = fleet_preflight(load_fleet(fleet), package=package, python=python, strict=strict)
        print_fleet_report(fleet_report, json_out)
        raise typer.Exit(fleet_report.code)
    if ctx.invoked_subcommand is None and package is None and python is None:
        from rigstack.interpreter import in_serving_python, option_words
        from rigstack.profiles import load_profile

        rerun = in_serving_python(["preflight", "--profile", profile, *option_words(
            model=model, json=json_out, strict=strict)], load_profile(profile))
        if rerun is not None:
            raise typer.Exit(rerun)
    if ctx.invoked_subcommand is None:
        from rigstack.output.preflight import print_report
        from rigstack.preflight.runner import preflight

        report = preflight(profile, model=model, package=package, python=python, strict=strict)
        print_report(report, json_out)
        raise typer.Exit(report.code)


@app.command("profiles")
def profiles(json_out: bool = typer.Option(False, "--json")) -> None:
    """List profiles, marking which fit this host's GPUs."""
    from rigstack.output.preflight import print_fits
    from rigstack.preflight.runner import fits

    print_fits(*fits(), as_json=json_out)


@app.command("show")
def show(name: str, resolved: bool = typer.Option(False, "--resolved", help="merge what it extends")) -> None:
    """Print a profile as written, or resolved."""
    from rigstack.output.preflight import print_text
    from rigstack.preflight.runner import profile_text

    print_text(profile_text(name, resolved))


@app.command("plan")
def plan(
    profile: str = typer.Option(DEFAULT_PROFILE, "--profile", "-p", help="profile name or YAML path"),
    pp: int | None = typer.Option(None, "--pp", min=1, help="pipeline stages (default: the profile's)"),
    tp: int | None = typer.Option(None, "--tp", min=1, help="tensor parallel size (default: the profile's)"),
    partition: str | None = typer.Option(None, "--partition", help="layers per stage, e.g. 11,10,10,10,10,10,9,8"),
    util: float | None = typer.Option(None, "--util", help="gpu-memory-utilization (default: the profile's)"),
    max_model_len: int | None = typer.Option(None, "--max-model-len", min=1),
    max_num_seqs: int | None = typer.Option(None, "--max-num-seqs", min=1),
    model: Path | None = typer.Option(None, help="model folder (config.json, safetensors headers)"),
    search: bool = typer.Option(False, "--search", help="search the partition that maximises the pool"),
    png: Path | None = typer.Option(None, help="chart path (default: results/plan/PROFILE.png)"),
    json_out: bool = typer.Option(False, "--json", help="the plan as JSON on stdout"),
) -> None:
    """Plan the KV pool vLLM will size for a profile, per stage, with vLLM's own code, and judge it against the
    planner's error bar (starts / marginal / refused); exit 2 if refused."""
    from rigstack.output.planner import check_chart_path, show_plan
    from rigstack.planner import default_png, plan_dict

    check_chart_path(png or default_png(profile))
    result = plan_dict(profile, pp=pp, tp=tp, partition=partition, util=util, max_model_len=max_model_len,
                       max_num_seqs=max_num_seqs, model=str(model) if model else None, search_partition=search)
    show_plan(result, png or default_png(profile), json_out)
    raise typer.Exit(2 if result["verdict"]["value"] == "refused" else 0)

