"""probe_bang.py: silent-corruption probe (seed 003). N greedy repeats of each prompt must be identical, with no
token id 0 (unless id 0 is one of the model's special tokens, e.g. its EOS) and no token at logprob -ln(vocab); exit 2
when something is found. `swap` reruns it with two devices swapped in CUDA_VISIBLE_DEVICES to see whether the fault
follows the card. Add --debug anywhere for tracebacks."""

from __future__ import annotations

from typing import Annotated

import typer

from rigstack.output.probes import SwapView, show_published
from rigstack.probes.cli import ApiKeyEnv, Fleet, Model, Out, Package, Profile, Target, Timeout, Url
from rigstack.probes import bang, swap

app = typer.Typer(add_completion=False, no_args_is_help=True)

Prompt = Annotated[list[str], typer.Option("--prompt", help="repeat for several (default: one long report)")]
MaxTokens = Annotated[int, typer.Option(help="tokens per run")]
Repeats = Annotated[int, typer.Option(help="greedy runs per prompt")]
Vocab = Annotated[int | None, typer.Option(help="vocabulary size (default: the local model's config.json)")]
Tol = Annotated[float, typer.Option(help="nats above -ln(vocab) that still count as uniform")]


@app.command()
def run(url: Url, model: Model, api_key_env: ApiKeyEnv = None, profile: Profile = None, package: Package = None,
        timeout: Timeout = 1800.0, prompt: Prompt = [], max_tokens: MaxTokens = 8000, repeats: Repeats = 30,
        vocab_size: Vocab = None, tol: Tol = 0.01,
        out: Out = None, fleet: Fleet = None) -> int:
    """Probe one running server."""
    return bang.main(Target(url, model, api_key_env, profile, package, timeout, fleet), prompt, max_tokens, repeats,
                     vocab_size, tol, out, show_published)


@app.command("swap")
def swap_cmd(url: Url, model: Model,
             devices: Annotated[str, typer.Option(help="CUDA_VISIBLE_DEVICES of the normal launch, e.g. 0,1,2,3")],
             swap_pair: Annotated[str, typer.Option("--swap", help="SUSPECT,OTHER: OTHER outside --devices is a "
                                                                  "spare (decisive)")],
             profile: Annotated[str | None, typer.Option(help="host profile that starts the server")] = None,
             serve_cmd: Annotated[str | None, typer.Option(help="or the foreground server command, e.g. "
                                                                "'vllm serve /models/x --port 8000'")] = None,
             dry_run: Annotated[bool, typer.Option("--dry-run", help="print the plan, start nothing")] = False,
             api_key_env: ApiKeyEnv = None, timeout: Timeout = 1800.0, prompt: Prompt = [],
             max_tokens: MaxTokens = 8000, repeats: Repeats = 30, vocab_size: Vocab = None, tol: Tol = 0.01,
             ready_timeout: Annotated[float, typer.Option(help="seconds to wait for each boot")] = 1800.0,
             out: Out = None) -> int:
    """Boot, probe and stop twice (baseline order, then two devices swapped); say whether the fault follows the card."""
    return swap.main(Target(url, model, api_key_env, profile, None, timeout), devices, swap_pair, serve_cmd,
                     dry_run, prompt, max_tokens, repeats, vocab_size, tol, ready_timeout, out, SwapView())

