"""bench.py: single-stream decode by workload (code, json, counting, math, prose): tok/s, TTFT, ms per step and
speculative acceptance. Greedy, fixed output length. Add --debug anywhere for tracebacks."""

from __future__ import annotations

from typing import Annotated

import typer

from rigstack.output.probes import show_published
from rigstack.probes.cli import ApiKeyEnv, Fleet, Model, Out, Package, Profile, StopAfter, Target, Timeout, Url
from rigstack.probes.streak import STOP_AFTER
from rigstack.probes import bench

app = typer.Typer(add_completion=False)


@app.command()
def main(url: Url, model: Model, api_key_env: ApiKeyEnv = None, profile: Profile = None, package: Package = None,
         timeout: Timeout = 600.0,
         stop_after: StopAfter = STOP_AFTER,
         workload: Annotated[list[str], typer.Option(help="repeat for several")] = ["code", "json", "counting",
                                                                                  "math", "prose"],
         max_tokens: Annotated[int, typer.Option(help="tokens per answer (pinned)")] = 256,
         fixed: Annotated[str, typer.Option(help="auto | ignore_eos | min_tokens | none")] = "auto",
         repeats: Annotated[int, typer.Option(help="passes over each prompt set")] = 1,
         warmup: Annotated[int, typer.Option(help="untimed requests first")] = 1,
         out: Out = None, fleet: Fleet = None) -> int:
    target = Target(url, model, api_key_env, profile, package, timeout, stop_after, fleet)
    return bench.main(target, workload, max_tokens, fixed, repeats, warmup, out, show_published)

