"""Benchmark: apply.py against seed 002's reproduce block, side by side in one run on the real pinned wheel.

(a) naive: unzip the package, `git init`, `git add -A`, commit, `git apply` each patch;
(b) `apply.py apply` as a newcomer (and every new pin) meets it: a fresh --out and a fresh rigstack cache holding
    the wheel alone, so the compiled objects are decompressed from it;
(c) `apply.py apply` into a fresh --out with the cache's extracted compiled objects kept (every later apply);
(d) `apply.py apply` warm re-run on (c)'s output.
Prints each time and the ratios a/b, a/c and d (target: a/b and a/c >= 4, d < 1 s). Runs are interleaved to share
the noise.
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


def _timed(command: list[str], env: dict[str, str] | None = None) -> float:
    os.sync()  # each run starts with no other run's writes still being flushed
    start = time.perf_counter()
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                   env={**os.environ, **(env or {})})
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
    naive, first, kept, warm = [], [], [], []
    for _ in range(rounds):
        with tempfile.TemporaryDirectory(prefix="bench-apply-", dir=ROOT / "build" if (ROOT / "build").is_dir()
                                         else None) as tmp:
            work = Path(tmp)
            naive.append(_naive(wheel, stack, work / "naive"))
            shutil.rmtree(work / "naive")
            apply = [sys.executable, str(ROOT / "apply.py"), "apply", "--patches", str(patches)]
            fresh = work / "cache"
            (fresh / "wheels").mkdir(parents=True)
            (fresh / "wheels" / wheel.name).symlink_to(wheel)  # the download, and nothing else of the cache
            first.append(_timed([*apply, "--out", str(work / "first")], env={"RIGSTACK_CACHE": str(fresh)}))
            shutil.rmtree(work / "first")
            kept.append(_timed([*apply, "--out", str(work / "out")]))
            warm.append(_timed([*apply, "--out", str(work / "out")]))
    a, b, c, d = (statistics.median(values) for values in (naive, first, kept, warm))
    cli.console.print(f"patches: {len(stack)}  rounds: {rounds}")
    cli.console.print(f"(a) naive unzip + git add + git apply:   {a:6.2f} s  {[round(v, 2) for v in naive]}")
    cli.console.print(f"(b) apply.py, only the wheel cached:     {b:6.2f} s  {[round(v, 2) for v in first]}")
    cli.console.print(f"(c) apply.py, compiled objects kept:     {c:6.2f} s  {[round(v, 2) for v in kept]}")
    cli.console.print(f"(d) apply.py warm re-run:                {d:6.2f} s  {[round(v, 2) for v in warm]}")
    cli.console.print(f"a/b = {a / b:.2f}x  a/c = {a / c:.2f}x (target >= 4)   d = {d:.2f} s (target < 1 s)")
    return 0


if __name__ == "__main__":
    sys.exit(cli.run(app))
