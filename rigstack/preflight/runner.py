"""Run every registered check on one profile, print the results, and turn them into an exit code."""

from __future__ import annotations

import json
import os
import shutil
import time
from dataclasses import replace
from pathlib import Path

import yaml
from rich.console import Console
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from rigstack.errors import UserError
from rigstack.preflight import hardware, host, image, model, package, settings  # noqa: F401 - registers checks
from rigstack.preflight.core import CHECKS, Context, Result, Status, fail
from rigstack.preflight.knowledge import find_package, search_path
from rigstack.preflight.nvml import scan
from rigstack.profiles import (TINY_PREFIX, Profile, list_profiles, load_profile, model_dir, read_yaml, resolve_path,
                               resolved_dict)

EXIT_OK, EXIT_WARN, EXIT_FAIL = 0, 1, 2
_STYLE = {Status.PASS: "green", Status.WARN: "yellow", Status.FAIL: "bold red", Status.SKIP: "dim"}
out = Console(highlight=False, soft_wrap=True)  # results on stdout; rigstack.cli's console is for errors


def _package(path: Path | None) -> Path | None:
    if path is None:
        return find_package()
    if not (path / "__init__.py").is_file():
        raise UserError(f"--package {path} is not a python package folder (no __init__.py); pass the vllm/ folder")
    # The package is imported by a subprocess in another folder: a relative path would name nothing there.
    return Path(os.path.abspath(path))


def _model(profile: Profile, package: Path | None, python: str | None) -> tuple[Path | None, str]:
    """The profile's model folder (the tiny model's is keyed by the serving interpreter's libraries), or why not."""
    tiny = profile.model.path.startswith(TINY_PREFIX)
    try:
        return model_dir(profile.model, build=False, path=search_path(package, python) if tiny else None), ""
    except UserError as error:
        return None, str(error)


def run_checks(profile: Profile, *, model: Path | None = None, package: Path | None = None,
               python: str | None = None, environ: dict[str, str] | None = None) -> list[Result]:
    if python is not None and shutil.which(python) is None:
        raise UserError(f"--python {python} is not an interpreter that can be run; pass the serving venv's bin/python")
    package = _package(package)
    folder, problem = (model, "") if model else _model(profile, package, python)
    ctx = Context(profile, model=folder, package=package, python=python, model_problem=problem)
    if environ is not None:
        ctx.environ = environ
    ordered = [entry for entry in CHECKS if not entry[2]] + [entry for entry in CHECKS if entry[2]]
    results = []
    for name, function, _slow in ordered:
        try:
            result = function(ctx)
        except UserError as error:
            result = fail(str(error), "fix what it names")
        results.append(replace(result, check=name))
    return results


def exit_code(results: list[Result], strict: bool) -> int:
    statuses = {result.status for result in results}
    if Status.FAIL in statuses:
        return EXIT_FAIL
    return EXIT_WARN if strict and Status.WARN in statuses else EXIT_OK


def _print(profile: Profile, results: list[Result], seconds: float) -> None:
    width = max(len(result.check) for result in results)
    for result in results:
        # Reasons quote profile values and paths: printed as text, never read as markup.
        out.print(Text.assemble((result.status.value, _STYLE[result.status]), f" {result.check:<{width}}  "
                                f"{result.reason}"))
        if result.fix and result.status in (Status.FAIL, Status.WARN):
            out.print(f"     {'':<{width}}  fix: {result.fix}", markup=False)
    counts = ", ".join(f"{sum(r.status is s for r in results)} {s.value}" for s in Status)
    out.print(f"{profile.name}: {counts} ({seconds:.1f} s)", markup=False)


def run_preflight(profile_name: str, *, model: Path | None = None, package: Path | None = None,
                  python: str | None = None, as_json: bool = False, strict: bool = False) -> int:
    start = time.perf_counter()
    profile = load_profile(profile_name)
    results = run_checks(profile, model=model, package=package, python=python)
    code = exit_code(results, strict)
    if as_json:
        print(json.dumps({"profile": profile.name, "exit_code": code,
                          "results": [result.as_json() for result in results]}, indent=2))
    else:
        _print(profile, results, time.perf_counter() - start)
    return code


def list_fits(as_json: bool = False) -> int:
    """Every profile, and whether it fits this host's GPUs (like a catalogue of compatible profiles)."""
    gpus = scan()
    rows = []
    for name in list_profiles():
        profile = load_profile(name)
        rows.append((profile, hardware.fit(profile, gpus)))
    if as_json:
        print(json.dumps([{"name": p.name, "gpus": p.gpus_needed, "fits": r.status is Status.PASS,
                           "reason": r.reason, "description": p.description} for p, r in rows], indent=2))
        return EXIT_OK
    host_line = ", ".join(sorted({g.name for g in gpus.gpus})) or gpus.problem or "no GPU"
    table = Table(title=escape(f"profiles (this host: {len(gpus.gpus)} GPU(s): {host_line})"), title_justify="left")
    for column in ("profile", "GPUs", "fits", "description"):
        table.add_column(column)
    for profile, result in rows:
        fits = "[green]yes[/]" if result.status is Status.PASS else "[dim]no[/]"
        table.add_row(Text(profile.name), str(profile.gpus_needed), fits, Text(profile.description))
    out.print(table)
    return EXIT_OK


def show(name: str, resolved: bool) -> int:
    """The profile file as written, or merged with everything it extends (and validated)."""
    if resolved:
        out.print(yaml.safe_dump(resolved_dict(load_profile(name)), sort_keys=False), markup=False, end="")
    else:
        path = resolve_path(name)
        read_yaml(path)  # refuses broken YAML with file and line
        out.print(path.read_text(), markup=False, end="")
    return EXIT_OK
