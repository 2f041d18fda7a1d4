"""qual.py: checkable items (exact arithmetic, JSON, seed 004's five agent-protocol cases), reported as n of m.
Add --debug anywhere for tracebacks."""

from __future__ import annotations

from typing import Annotated

import typer

from rigstack.output.probes import show_published
from rigstack.probes.cli import ApiKeyEnv, Fleet, Model, Out, Package, Profile, StopAfter, Target, Timeout, Url
from rigstack.probes.streak import STOP_AFTER
from rigstack.probes import qual

app = typer.Typer(add_completion=False)


@app.command()
def main(url: Url, model: Model, api_key_env: ApiKeyEnv = None, profile: Profile = None, package: Package = None,
         timeout: Timeout = 600.0,
         stop_after: StopAfter = STOP_AFTER,
         group: Annotated[list[str], typer.Option(help="arithmetic | json | agent; repeat; default all")] = [],
         max_tokens: Annotated[int, typer.Option(help="answer budget per item")] = 1024,
         out: Out = None, fleet: Fleet = None) -> int:
    target = Target(url, model, api_key_env, profile, package, timeout, stop_after, fleet)
    return qual.main(target, group, max_tokens, out, show_published)

