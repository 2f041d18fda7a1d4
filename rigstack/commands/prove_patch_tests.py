"""rigstack prove-patch-tests: every patch's tests pass on the patched vllm package and fail on the pristine one with
the patches below it applied (built from --pristine and kept in the rigstack cache).

    python scripts/prove_patch_tests.py --pristine DIR/vllm --patched DIR/vllm [--only 0001,0002] [--json]

Exits 1 unless every patch is proven.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from rigstack import cli, patchtests
from rigstack.errors import UserError
from rigstack.output import print_json
from rigstack.stack import DEFAULT_PATCHES_DIR, load_stack

app = typer.Typer(add_completion=False,
                  help="Prove that each patch's tests pass patched and fail on the stack below it.")


@app.command()
def main(
    pristine: Annotated[Path, typer.Option(help="the unpatched vllm package folder (with its .so files); each "
                                                "patch's baseline is a copy with the patches below it applied")],
    patched: Annotated[Path, typer.Option(help="the same package with the stack applied")],
    only: Annotated[str | None, typer.Option(help="comma-separated patch ids to prove, nothing else")] = None,
    markers: Annotated[str, typer.Option(help="pytest -m expression choosing the tests")] = patchtests.DEFAULT_MARKERS,
    patches: Annotated[Path, typer.Option(help="the patch folder")] = DEFAULT_PATCHES_DIR,
    as_json: Annotated[bool, typer.Option("--json", help="machine-readable result on stdout")] = False,
) -> int:
    """Run the patch tests on the patched package and each patch's baseline; exit 1 unless every patch is proven."""
    from rigstack.output.proofs import print_proof

    proof = patchtests.prove(load_stack(patches), pristine, patched, tuple(filter(None, (only or "").split(","))),
                             markers)
    if as_json:
        print_json(patchtests.proof_json(proof))
    print_proof(proof, cli.console)
    if not proof.ok:
        raise UserError(f"{sum(not p.ok for p in proof.patches)} patch(es) not proven (listed above); fix their tests "
                        "or mark tests that check kept behaviour upstream_guard")
    return 0
