"""expert-trace: collect the expert picks a running server counted (VLLM_EXPERT_COUNTS=1, VLLM_SERVER_DEV_MODE=1;
patch 0014), optionally after sending a prompt set; report per layer how concentrated they are; choose each layer's
hot set for a cache size or device budget; write the hot-set file VLLM_EXPERT_OFFLOAD reads (the profile's
offload.hot_set). Add --debug anywhere for tracebacks."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from rigstack import expert_trace
from rigstack.atomic import check_writable
from rigstack.client import Server
from rigstack.endpoint import Endpoint, api_key_from_env
from rigstack.cli import console
from rigstack.errors import UserError
from rigstack.files import read_utf8
from rigstack.output.expert_trace import show_trace
from rigstack.probes.cli import ApiKeyEnv, Model, Timeout, Url
from rigstack.profiles import load_profile

app = typer.Typer(add_completion=False, no_args_is_help=True)
PROMPTS_LIMIT = 16 << 20  # far more prompts than a trace sends; a /dev/zero is refused at this bound


@app.command()
def main(
    url: Url,
    model: Model,
    api_key_env: ApiKeyEnv = None,
    timeout: Timeout = 600.0,
    profile: Annotated[str | None, typer.Option(help="take --out and --cache from this profile's offload: section")]
    = None,
    out: Annotated[Path | None, typer.Option(help="hot-set file to write (default: the profile's offload.hot_set)")]
    = None,
    cache: Annotated[int | None, typer.Option(help="hot experts a layer")] = None,
    budget_gib: Annotated[float | None, typer.Option(help="or device GiB for the caches of all layers")] = None,
    prompts: Annotated[Path | None, typer.Option(help="send these prompts first, one a line")] = None,
    max_tokens: Annotated[int, typer.Option(help="tokens generated per prompt")] = 64,
    reset: Annotated[bool, typer.Option(help="zero the server's counts after reading them")] = False,
    top_k: Annotated[int | None, typer.Option(help="experts a token picks, for the decode prediction")] = None,
    link_gb_s: Annotated[float | None, typer.Option(help="miss gather GB/s, for the decode prediction")] = None,
    compute_ms: Annotated[float, typer.Option(help="GPU time of a decode step without transfers, ms")] = 0.0,
) -> int:
    """Trace the expert picks of a running server and write per-layer hot sets."""
    if profile is not None:
        offload = load_profile(profile).offload
        if offload is None or offload.hot_set is None:
            raise UserError(f"profile {profile} has no offload.hot_set; give --out")
        out = out or Path(offload.hot_set)
        if cache is None and budget_gib is None:
            cache = offload.hot_experts_per_layer
    if out is not None and out.is_dir():
        raise UserError(f"--out {out} is a folder; give the hot-set file's path (e.g. {out / 'hot-experts.json'})")
    if out is not None:
        check_writable(out, "the hot-set file", "give --out a path you can write")
    lines = [] if prompts is None else [line for line in read_utf8(prompts, "prompt file", PROMPTS_LIMIT,
                                                                   "give a text file, one prompt a line").splitlines()
                                        if line.strip()]
    server = Server(Endpoint(url, model, api_key_from_env(api_key_env)), timeout)
    report = expert_trace.collect(server, cache, budget_gib, lines, max_tokens, reset, top_k, link_gb_s, compute_ms)
    show_trace(report)
    if out is not None:
        expert_trace.write_hot_sets(out, report.trace, report.hot_plan)
        console.print(f"wrote {out}")
    return 0

