"""The `rigstack` command: each subcommand is a module of rigstack.commands over one library call.

    rigstack apply|check|status|diff|export|import|port   the patch stack (apply.py)
    rigstack preflight [profiles|show|plan]                checks before a boot (preflight.py)
    rigstack plan                                          vLLM's KV pool per stage (preflight.py plan)
    rigstack plan-published | plan-shipped                 the README's planner tables (serving interpreter)
    rigstack image build|verify|base                       rig images (python -m rigstack.images)
    rigstack serve | stop                                  the launcher (scripts/run_prod.py)
    rigstack bench|conc|needle|qual|compare|bang           the probes (scripts/*.py)
    rigstack expert-trace                                  per-layer hot sets (scripts/expert_trace.py)
    rigstack upstream-tests                                vLLM's own tests, pristine vs patched (scripts/...)
    rigstack prove-patch-tests                             each patch's tests: pass patched, fail below it (scripts/...)
    rigstack twin                                          the CPU twin's wheel built from the sdist (make cpu)
"""

from __future__ import annotations

import typer

from rigstack import cli
from rigstack.commands import (bang, bench, compare, conc, expert_trace, image, needle, plan_tables, preflight,
                               prove_patch_tests, qual, serve, stack, twin, upstream_tests)

app = typer.Typer(add_completion=False, no_args_is_help=True,
                  help="rigstack: a pinned, patched vLLM for odd GPU rigs. Add --debug anywhere for tracebacks.")
app.add_typer(stack.app)  # no name: apply, check, status, ... are top-level commands
app.add_typer(preflight.app, name="preflight")
app.command("plan")(preflight.plan)
app.command("plan-published")(plan_tables.published)
app.command("plan-shipped")(plan_tables.shipped)
app.add_typer(image.app, name="image")
app.command("serve")(serve.serve)
app.command("stop")(serve.stop)
PROBES = {
    bench: "single-stream decode by workload: tok/s, TTFT, ms per step, speculative acceptance",
    conc: "concurrency sweep or open-loop Poisson rates: TTFT, TPOT, ITL, E2E percentiles, tok/s",
    needle: "a planted fact in haystacks of several lengths and depths: pass/fail per cell",
    qual: "checkable items (arithmetic, JSON, agent-protocol cases), reported as n of m",
    compare: "exit 2 when result B regresses on result A beyond the tolerances",
}
for module, summary in PROBES.items():
    app.command(module.__name__.rsplit(".", 1)[1], help=summary)(module.main)
app.command("expert-trace")(expert_trace.main)
app.command("upstream-tests")(upstream_tests.main)
app.command("prove-patch-tests")(prove_patch_tests.main)
app.command("twin")(twin.main)
app.add_typer(bang.app, name="bang", help="silent-corruption probe: greedy repeats must be identical (seed 003)")


def main() -> int:
    """The console script's entry: `rigstack ...`."""
    return cli.run(app)
