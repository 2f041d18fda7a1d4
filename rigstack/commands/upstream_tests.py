"""rigstack upstream-tests: vLLM's own tests of every module the stack touches, run on the pristine and the patched
package and compared.

    python scripts/upstream_tests.py --pristine DIR/vllm --patched DIR/vllm [--all] [--out build/upstream-tests.json]

Exits 1 unless every upstream test that passes on the pristine package passes on the patched one.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from rigstack import upstreamtests
from rigstack.cli import console
from rigstack.errors import UserError
from rigstack.output.upstream import show_upstream
from rigstack.stack import DEFAULT_PATCHES_DIR, load_stack
from rigstack.versions import REPO_ROOT, load_pins

app = typer.Typer(add_completion=False, help="vLLM's own tests: the patched package passes what the pristine passes.")


@app.command()
def main(
    pristine: Annotated[Path, typer.Option(help="the unpatched vllm package folder (with its .so files)")],
    patched: Annotated[Path, typer.Option(help="the same package with the stack applied")],
    run_all: Annotated[bool, typer.Option("--all", help="every covering test file, not the CI's closest "
                                                        f"{upstreamtests.MAX_FILES_PER_MODULE} per module")] = False,
    out: Annotated[Path, typer.Option(help="where the JSON table goes")] = REPO_ROOT / "build" / upstreamtests.OUT_FILE,
    patches: Annotated[Path, typer.Option(help="the patch folder")] = DEFAULT_PATCHES_DIR,
) -> int:
    """Pick, run twice, compare; the table on stdout, the JSON in --out."""
    report = upstreamtests.run_upstream_tests(load_pins(), load_stack(patches), pristine, patched,
                                              None if run_all else upstreamtests.MAX_FILES_PER_MODULE)
    upstreamtests.write_json(report, out)
    show_upstream(report)
    console.print(f"table: {out}")
    if not report.ok:
        what = (f"{len(report.total.regressions)} upstream test(s) pass on the pristine package and not on the patched "
                "one (listed above)" if report.total.regressions else "no upstream test passes on the pristine package")
        raise UserError(f"{what}; see {out}")
    return 0

