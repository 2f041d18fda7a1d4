"""Faulty-card isolation (seed 003): run the corruption probe twice, the second time with two devices swapped in
CUDA_VISIBLE_DEVICES, and say whether the fault follows the physical card.

Swapping a suspect card with a spare (a device outside the set) is the decisive form: if the fault leaves with the
card, it is the card. Swapping two cards inside the set only moves the suspect to another position (another
pipeline stage), so a fault that stays is consistent with the card but is not proof.
"""

from __future__ import annotations

import shlex
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from rigstack import render
from rigstack.client import Server
from rigstack.errors import UserError
from rigstack.probes.bang import DEFAULT_PROMPT, failures, is_suspect, run_bang
from rigstack.probes.cli import Published, Target, default_out, publish
from rigstack.probes.results import Result
from rigstack.profiles import load_profile, model_dir
from rigstack.serving import events
from rigstack.serving.process import stop
from rigstack.serving.ready import launch
from rigstack.serving.unit import format_command


@dataclass(frozen=True)
class SwapPlan:
    devices: tuple[str, ...]
    suspect: str
    other: str

    @property
    def spare(self) -> bool:
        """True when `other` is not in the set: the suspect card leaves the run entirely."""
        return self.other not in self.devices

    @property
    def orders(self) -> tuple[tuple[str, str], tuple[str, str]]:
        swapped = [self.other if d == self.suspect else self.suspect if d == self.other else d for d in self.devices]
        return ("baseline", ",".join(self.devices)), ("swapped", ",".join(swapped))


@dataclass(frozen=True)
class Planned:
    """What the swap will do (describe's lines), before anything starts; dry_run: nothing will."""

    lines: list[str]
    dry_run: bool


@dataclass(frozen=True)
class Verdict:
    text: str


# What a swap reports, in order: its plan, each boot's wait (launch's events), each result, the verdict.
Event = Planned | events.Event | Published | Verdict
OnEvent = Callable[[Event], None]


def make_plan(devices: str, swap: str) -> SwapPlan:
    order = tuple(d.strip() for d in devices.split(",") if d.strip())
    pair = tuple(d.strip() for d in swap.split(",") if d.strip())
    if len(pair) != 2 or pair[0] == pair[1]:
        raise UserError(f"--swap {swap!r}: give two different devices, suspect first, like --swap 3,7")
    if len(set(order)) != len(order):
        raise UserError(f"--devices {devices!r} lists a device twice; list each once, in launch order")
    if pair[0] not in order:
        raise UserError(f"--swap {swap!r}: suspect {pair[0]} is not in --devices {devices}; swap a device in use")
    return SwapPlan(order, pair[0], pair[1])


def verdict(plan: SwapPlan, baseline_clean: bool, swapped_clean: bool) -> str:
    card = f"card {plan.suspect}"
    if baseline_clean:
        return "no fault in the baseline run: nothing to isolate (raise --repeats or --max-tokens and rerun)"
    if plan.spare:
        if swapped_clean:
            return f"the fault follows {card}: gone once {card} was replaced by spare {plan.other}"
        return f"the fault does not follow {card}: it stays with {card} replaced by {plan.other}; suspect another card"
    if swapped_clean:
        return (f"the fault vanished when {card} and {plan.other} swapped positions: it depends on the position "
                "(stage), not a single card; check the software on that stage")
    return (f"the fault stays with {card} moved to another position: consistent with the card, not proof; "
            "swap it with a spare (a device outside --devices) to decide")


def serve_argv(serve_cmd: str | None, profile: str | None, build: bool = True) -> tuple[list[str], dict[str, str]]:
    """The foreground server command: given literally, or rendered from a host profile (a locally built model is
    built first unless `build` is False, as for a dry run, which only names where it will be)."""
    if serve_cmd:
        return shlex.split(serve_cmd), {}
    if not profile:
        raise UserError("say how to start the server: --profile NAME or --serve-cmd 'vllm serve ...'")
    loaded = load_profile(profile)
    if loaded.image:
        raise UserError(f"profile {profile} runs in a container, where CUDA_VISIBLE_DEVICES is set by docker; "
                        "pass the in-container command with --serve-cmd instead")
    if loaded.parallel.replicas > 1:
        raise UserError(f"profile {profile} starts {loaded.parallel.replicas} replicas, and the swap probes one "
                        "server; pass that replica's command with --serve-cmd")
    command = render.serve_command(loaded, model=model_dir(loaded.model, build=build))
    return command.argv, command.env


def describe(plan: SwapPlan, argv: list[str], env: dict[str, str], url: str) -> list[str]:
    lines = [f"suspect card {plan.suspect}, swapped with {plan.other} ({'a spare' if plan.spare else 'in use'})"]
    for label, order in plan.orders:
        overlay = {**env, "CUDA_DEVICE_ORDER": "PCI_BUS_ID", "CUDA_VISIBLE_DEVICES": order}
        lines.append(f"{label}: start, wait for {url}, run the corruption probe, stop:\n"
                     f"{format_command(argv, overlay)}")
    lines.append("reading: a fault in the baseline that is gone once the suspect is swapped for a spare follows "
                 "the card")
    return lines


def run_swap(plan: SwapPlan, argv: list[str], env: dict[str, str], server: Server, prompts: list[str],
             max_tokens: int, repeats: int, vocab_size: int | None, tol: float, ready_timeout_s: float,
             run_root: Path, on_event: events.OnEvent = events.quiet) -> list[Result]:
    """Boot, probe and stop once per order; both probe results."""
    results = []
    for label, order in plan.orders:
        run_dir = run_root / f"swap-{label}"
        overlay = {**env, "CUDA_DEVICE_ORDER": "PCI_BUS_ID", "CUDA_VISIBLE_DEVICES": order}
        launch(argv, overlay, run_dir, url=server.endpoint.base, served_name=server.endpoint.model,
               timeout_s=ready_timeout_s, on_event=on_event)
        try:
            results.append(run_bang(server, prompts, max_tokens, repeats, vocab_size, tol, None, None))
        finally:
            stop(run_dir, on_event=on_event)
    return results


def main(target: Target, devices: str, swap: str, serve_cmd: str | None, dry_run: bool, prompts: list[str],
         max_tokens: int, repeats: int, vocab_size: int | None, tol: float, ready_timeout_s: float,
         out: Path | None, on_event: OnEvent) -> int:
    plan = make_plan(devices, swap)
    argv, env = serve_argv(serve_cmd, target.profile, build=not dry_run)
    on_event(Planned(describe(plan, argv, env, target.url), dry_run))
    if dry_run:
        return 0
    out = default_out("swap", out)
    server = target.server()
    results = run_swap(plan, argv, env, server, prompts or [DEFAULT_PROMPT], max_tokens, repeats, vocab_size, tol,
                       ready_timeout_s, out.resolve().parent, on_event)
    for (label, _), result in zip(plan.orders, results):
        on_event(publish(result, out.with_name(f"{out.name}-{label}"), server))
    # A run whose requests failed proves nothing either way: say so rather than read it as a fault.
    for (label, _), result in zip(plan.orders, results):
        error = failures(result, f"the {label} run")
        if error and not is_suspect(result):
            raise error
    on_event(Verdict(verdict(plan, not is_suspect(results[0]), not is_suspect(results[1]))))
    return 0
