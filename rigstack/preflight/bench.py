"""Time `python preflight.py --profile NAME` as a user runs it (a fresh process each time) against the 2 s target.

Two settings side by side, interleaved so they share the machine's noise: Python with its bytecode cache (what a
user's install has; the cache goes to a private folder so no venv is written to) and without one (every module
compiled from source on each start, as in a sandbox with PYTHONDONTWRITEBYTECODE=1)."""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass

from rigstack.cache import cache_dir
from rigstack.versions import REPO_ROOT

TARGET_S = 2.0


@dataclass(frozen=True)
class Setting:
    name: str
    first_s: float  # the untimed run that fills the caches
    wall_s: float  # medians of the timed runs
    cpu_s: float


@dataclass(frozen=True)
class PreflightTiming:
    """What bench_preflight measured (rigstack/output/preflight.py shows it); the headline is the cached setting."""

    args: list[str]
    runs: int
    settings: list[Setting]
    exit_code: int  # preflight's own, of the last run
    cpus: int | None
    load: float

    @property
    def headline_s(self) -> float:
        return self.settings[0].wall_s


def _env(bytecode: bool) -> dict[str, str]:
    env = {**os.environ, "COLUMNS": "200"}
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    if bytecode:
        env["PYTHONPYCACHEPREFIX"] = str(cache_dir() / "pycache")
    else:
        env["PYTHONDONTWRITEBYTECODE"] = "1"
        env.pop("PYTHONPYCACHEPREFIX", None)
    return env


def _once(args: list[str], env: dict[str, str]) -> tuple[float, float, int]:
    """Wall and CPU seconds (user + system, of the child) of one run, and its exit code."""
    before = os.times()
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "preflight.py", *args], cwd=REPO_ROOT, capture_output=True, env=env)
    wall = time.perf_counter() - start
    after = os.times()
    cpu = (after.children_user - before.children_user) + (after.children_system - before.children_system)
    return wall, cpu, done.returncode


def bench_preflight(profile: str, runs: int = 5, extra: list[str] | None = None) -> PreflightTiming:
    """One untimed run per setting fills the caches (vLLM's flags, bytecode); then `runs` timed runs of each."""
    args = ["--profile", profile, *(extra or [])]
    settings = {"with bytecode cache": _env(True), "without bytecode cache": _env(False)}
    first = {name: _once(args, env) for name, env in settings.items()}
    timings: dict[str, list[tuple[float, float]]] = {name: [] for name in settings}
    for _ in range(runs):
        for name, env in settings.items():
            wall, cpu, code = _once(args, env)
            timings[name].append((wall, cpu))
    measured = [Setting(name, first[name][0], statistics.median(v[0] for v in values),
                        statistics.median(v[1] for v in values)) for name, values in timings.items()]
    return PreflightTiming(args, runs, measured, code, os.cpu_count(), os.getloadavg()[0])
