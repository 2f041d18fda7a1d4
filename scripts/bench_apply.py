"""Benchmark: apply.py against seed 002's reproduce block, side by side in one run on the real pinned wheel.

(a) naive: unzip the package, `git init`, `git add -A`, commit, `git apply` each patch;
(b) `apply.py apply` cold (a fresh --out; only the wheel download is cached);
(c) `apply.py apply` warm re-run on (b)'s output.
Prints each time and the ratios a/b and c (target: a/b >= 4, c < 1 s). Runs are interleaved to share the noise.
"""

from __future__ import annotations

import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Annotated

import typer

from rigstack import cli
from rigstack.baseline import fetch_wheel
from rigstack.stack import DEFAULT_PATCHES_DIR, load_stack
from rigstack.versions import load_pins

ROOT = Path(__file__).resolve().parent.parent

app = typer.Typer(add_completion=False)


def _timed(command: list[str], cwd: Path | None = None) -> float:
    os.sync()  # each run starts with no other run's writes still being flushed
    start = time.perf_counter()
    subprocess.run(command, cwd=cwd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - start


def _naive(wheel: Path, patches: list[Path], work: Path) -> float:
    os.sync()
    start = time.perf_counter()
    subprocess.run(["unzip", "-q", str(wheel), "vllm/*", "-d", str(work)], check=True)
    for step in (["git", "init", "-q"], ["git", "add", "-A"], ["git", "commit", "-qm", "baseline"]):
        subprocess.run(step, cwd=work, check=True, stdout=subprocess.DEVNULL)
    for patch in patches:
        subprocess.run(["git", "apply", "--whitespace=nowarn", str(patch)], cwd=work, check=True)
    return time.perf_counter() - start


@app.command()
def main(rounds: Annotated[int, typer.Option(help="interleaved rounds; medians are reported")] = 3,
         patches: Path = DEFAULT_PATCHES_DIR) -> int:
    wheel = fetch_wheel(load_pins(), "gpu")
    stack = [patch.path for patch in load_stack(patches).patches]
    naive, cold, warm = [], [], []
    for _ in range(rounds):
        with tempfile.TemporaryDirectory(prefix="bench-apply-", dir=ROOT / "build" if (ROOT / "build").is_dir()
                                         else None) as tmp:
            work = Path(tmp)
            naive.append(_naive(wheel, stack, work / "naive"))
            shutil.rmtree(work / "naive")
            apply = [sys.executable, str(ROOT / "apply.py"), "apply", "--patches", str(patches),
                     "--out", str(work / "out")]
            cold.append(_timed(apply))
            warm.append(_timed(apply))
    a, b, c = (statistics.median(values) for values in (naive, cold, warm))
    cli.console.print(f"patches: {len(stack)}  rounds: {rounds}")
    cli.console.print(f"(a) naive unzip + git add + git apply: {a:6.2f} s  {[round(v, 2) for v in naive]}")
    cli.console.print(f"(b) apply.py cold:                     {b:6.2f} s  {[round(v, 2) for v in cold]}")
    cli.console.print(f"(c) apply.py warm re-run:              {c:6.2f} s  {[round(v, 2) for v in warm]}")
    cli.console.print(f"a/b = {a / b:.2f}x (target >= 4)   c = {c:.2f} s (target < 1 s)")
    return 0


if __name__ == "__main__":
    sys.exit(cli.run(app))
