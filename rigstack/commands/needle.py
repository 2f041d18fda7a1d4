"""needle.py: a planted fact in haystacks of several lengths, at several depths; pass/fail per cell and a heatmap.
Add --debug anywhere for tracebacks."""

from __future__ import annotations

from typing import Annotated

import typer

from rigstack.output.probes import show_published
from rigstack.probes.cli import ApiKeyEnv, Fleet, Model, Out, Package, Profile, StopAfter, Target, Timeout, Url
from rigstack.probes.streak import STOP_AFTER
from rigstack.probes import needle

app = typer.Typer(add_completion=False)


@app.command()
def main(url: Url, model: Model, api_key_env: ApiKeyEnv = None, profile: Profile = None, package: Package = None,
         timeout: Timeout = 1800.0,
         stop_after: StopAfter = STOP_AFTER,
         lengths: Annotated[str, typer.Option(help="context lengths in tokens, comma-separated")] = "1024,4096,16384",
         depths: Annotated[str, typer.Option(help="needle depths 0..1, comma-separated")] = "0,0.25,0.5,0.75,1",
         seed: Annotated[int, typer.Option(help="seed of the planted codes")] = 0,
         out: Out = None, fleet: Fleet = None) -> int:
    return needle.main(Target(url, model, api_key_env, profile, package, timeout, stop_after, fleet),
                       [int(x) for x in lengths.split(",") if x.strip()],
                       [float(x) for x in depths.split(",") if x.strip()], seed, out, show_published)

