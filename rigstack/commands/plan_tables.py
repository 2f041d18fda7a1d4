"""The README's planner tables, planned with vLLM's own code (run by the serving interpreter):

    python -m rigstack plan-published [--held-out]   the seeds' published KV pools against the plan
    python -m rigstack plan-shipped             every shipped GPU profile on the pin and the search's partition
"""

from __future__ import annotations

import sys

import typer

from rigstack.errors import UserError


def _need_vllm(what: str, command: str) -> None:
    from rigstack.interpreter import has_vllm, serving_python

    if not has_vllm():  # core.plan builds the KV specs with vLLM's own classes
        raise UserError(f"{what} are planned with vLLM's own code and {sys.executable} has no vllm; run "
                        f"`{serving_python() or 'the serving interpreter'} -m rigstack {command}`")


def published(held_out: bool = typer.Option(False, "--held-out", help="fixed_gib fitted on every measured case "
                                            "jointly, and each case planned with the fit that left it out")) -> None:
    """The seeds' published pools against the plan: the README's table."""
    _need_vllm("the published pools", "plan-published")
    if held_out:
        from rigstack.output.planner import show_held_out
        from rigstack.planner import heldout

        show_held_out(heldout.fit())
        return
    from rigstack.output.planner import show_published
    from rigstack.planner.core import RESERVE
    from rigstack.planner.published import table

    show_published(RESERVE, table())


def shipped() -> None:
    """Every shipped GPU profile planned on the pin, and the search's partition: the README's table."""
    _need_vllm("the shipped profiles", "plan-shipped")
    from rigstack.output.planner import show_shipped
    from rigstack.planner.shipped import table

    show_shipped(table())
