"""conc.py: concurrency sweep (closed loop: 1, 2, 4, ... N streams) or open-loop Poisson rates: TTFT, TPOT, ITL,
E2E percentiles, aggregate, per-stream and steady-state tok/s, failed requests. Add --debug for tracebacks."""

from __future__ import annotations

from typing import Annotated

import typer

from rigstack.output.probes import show_published
from rigstack.probes.cli import ApiKeyEnv, Fleet, Model, Out, Package, Profile, StopAfter, Target, Timeout, Url
from rigstack.probes.streak import STOP_AFTER
from rigstack.probes import conc

app = typer.Typer(add_completion=False)


@app.command()
def main(url: Url, model: Model, api_key_env: ApiKeyEnv = None, profile: Profile = None, package: Package = None,
         timeout: Timeout = 600.0,
         stop_after: StopAfter = STOP_AFTER,
         levels: Annotated[str, typer.Option(help="closed-loop stream counts, comma-separated [1,2,4,8 unless "
                                                  "--rates is given]")] = "",
         rates: Annotated[str, typer.Option(help="open-loop requests/s, comma-separated")] = "",
         requests: Annotated[int, typer.Option(help="requests per level (0: 4 per stream, 32 per rate)")] = 0,
         workload: Annotated[str, typer.Option(help="prompt set")] = "prose",
         max_tokens: Annotated[int, typer.Option(help="tokens per answer (pinned)")] = 200,
         fixed: Annotated[str, typer.Option(help="auto | ignore_eos | min_tokens | none")] = "auto",
         interval: Annotated[float, typer.Option(help="seconds between /metrics samples")] = 0.5,
         seed: Annotated[int, typer.Option(help="seed of the Poisson schedule")] = 0,
         warmup: Annotated[int, typer.Option(help="untimed requests first")] = 1,
         out: Out = None, fleet: Fleet = None) -> int:
    target = Target(url, model, api_key_env, profile, package, timeout, stop_after, fleet)
    return conc.main(target, levels, rates, requests, workload, max_tokens, fixed, interval, seed, warmup, out,
                     show_published)

