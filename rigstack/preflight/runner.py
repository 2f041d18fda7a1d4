"""Run every registered check on one profile and turn the results into an exit code (rigstack.output.preflight
renders them)."""

from __future__ import annotations

import os
import shutil
import time
from dataclasses import dataclass, replace
from pathlib import Path

import yaml

from rigstack.errors import UserError
# Imported (hardware too) for their side effect: each module registers its checks in CHECKS.
import rigstack.preflight.host  # noqa: F401
import rigstack.preflight.image  # noqa: F401
import rigstack.preflight.model  # noqa: F401
import rigstack.preflight.package  # noqa: F401
import rigstack.preflight.scale  # noqa: F401
import rigstack.preflight.settings  # noqa: F401
from rigstack.preflight import hardware
from rigstack.preflight.core import CHECKS, Context, Result, Status, fail
from rigstack.preflight.knowledge import find_package, search_path
from rigstack.preflight.nvml import GpuScan, scan
from rigstack.profiles import (TINY_PREFIX, Profile, list_profiles, load_profile, model_dir, read_yaml, resolve_path,
                               resolved_dict)

EXIT_OK, EXIT_WARN, EXIT_FAIL = 0, 1, 2


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


@dataclass(frozen=True)
class PreflightReport:
    profile: Profile
    results: list[Result]
    code: int  # EXIT_OK, EXIT_WARN (warnings with --strict) or EXIT_FAIL
    seconds: float

    def to_json(self) -> dict[str, object]:
        return {"profile": self.profile.name, "exit_code": self.code,
                "results": [result.as_json() for result in self.results]}


def preflight(profile_name: str, *, model: Path | None = None, package: Path | None = None,
              python: str | None = None, strict: bool = False) -> PreflightReport:
    start = time.perf_counter()
    profile = load_profile(profile_name)
    results = run_checks(profile, model=model, package=package, python=python)
    return PreflightReport(profile, results, exit_code(results, strict), time.perf_counter() - start)


def fits() -> tuple[GpuScan, list[tuple[Profile, Result]]]:
    """Every profile, and whether it fits this host's GPUs (like a catalogue of compatible profiles)."""
    gpus = scan()
    return gpus, [(profile, hardware.fit(profile, gpus)) for profile in map(load_profile, list_profiles())]


def profile_text(name: str, resolved: bool) -> str:
    """The profile file as written, or merged with everything it extends (and validated)."""
    if resolved:
        return yaml.safe_dump(resolved_dict(load_profile(name)), sort_keys=False)
    path = resolve_path(name)
    read_yaml(path)  # refuses broken YAML with file and line
    return path.read_text()
