"""rigstack apply|check|status|diff|export|import|port (and apply.py): apply the patch stack to a vLLM package
(pinned wheel, Docker image, or a directory) with git."""

from __future__ import annotations

import sys
from enum import Enum
from pathlib import Path
from typing import Annotated

import typer

from rigstack import applier, cli, importer, lock, patched
from rigstack import port as porting
from rigstack.baseline import parse_source
from rigstack.errors import UserError
from rigstack.output import print_json
from rigstack.output.imports import print_result
from rigstack.output.port import print_report
from rigstack.output.stack import print_stack_result, print_status
from rigstack.stack import DEFAULT_PATCHES_DIR, load_stack
from rigstack.versions import load_pins

app = typer.Typer(add_completion=False, no_args_is_help=True,
                  help="Apply rigstack's patch stack to vLLM. Add --debug anywhere for tracebacks.")

FromOpt = Annotated[str, typer.Option("--from", help="wheel | wheel:cpu | image:REF | dir:PATH")]
OutOpt = Annotated[Path | None, typer.Option(help="work folder for wheel/image sources [build/vllm-<version>]")]
PatchesOpt = Annotated[Path, typer.Option(help="the patch folder")]
UntilOpt = Annotated[str | None, typer.Option(help="apply patches up to and including this id")]
OnlyOpt = Annotated[str | None, typer.Option(help="comma-separated ids to apply, nothing else")]
JsonOpt = Annotated[bool, typer.Option("--json", help="machine-readable result on stdout")]
PackageArg = Annotated[Path, typer.Argument(help="a patched vllm package folder")]
BaseShaOpt = Annotated[str | None, typer.Option("--base-sha256", help="expected sha256 of a wheel:X.Y.Z base")]


def _run(source: str, out: Path | None, patches: Path, until: str | None, only: str | None, as_json: bool,
         dry_run: bool) -> int:
    stack, notes = load_stack(patches).select(until, tuple(filter(None, (only or "").split(","))))
    notes += stack.unfilled_notes()
    result = applier.apply_stack(parse_source(source), stack, load_pins(), out=out, dry_run=dry_run,
                                 notes=tuple(notes))
    if as_json:
        print_json(result.to_json())
    print_stack_result(result, cli.console)
    if result.error:
        raise UserError(result.error)
    return 0


@app.command()
def apply(source: FromOpt = "wheel", out: OutOpt = None, patches: PatchesOpt = DEFAULT_PATCHES_DIR,
          until: UntilOpt = None, only: OnlyOpt = None, as_json: JsonOpt = False) -> int:
    """Apply the stack (idempotent); the default fetches the pinned GPU wheel into build/."""
    return _run(source, out, patches, until, only, as_json, dry_run=False)


@app.command()
def check(source: FromOpt = "wheel", out: OutOpt = None, patches: PatchesOpt = DEFAULT_PATCHES_DIR,
          until: UntilOpt = None, only: OnlyOpt = None, as_json: JsonOpt = False) -> int:
    """Report what apply would do; writes nothing."""
    return _run(source, out, patches, until, only, as_json, dry_run=True)


@app.command()
def status(package: PackageArg, as_json: JsonOpt = False) -> int:
    """What is applied to a package, from its stamp and git history."""
    result = patched.status(package)
    if as_json:
        print_json(result)
    else:
        print_status(result, cli.console)
    return 0


class ExportFormat(str, Enum):
    patches = "patches"
    mbox = "mbox"


@app.command()
def export(package: PackageArg, to: Annotated[Path, typer.Option(help="folder for the patch files")] = Path(
        "exported-patches"),
        fmt: Annotated[ExportFormat, typer.Option("--format", help="patches: one file each; mbox: one file (--to "
                                                  "FILE) for `git am`")] = ExportFormat.patches) -> int:
    """Regenerate the patch files from the package's commits."""
    if fmt is ExportFormat.mbox:
        cli.console.print(f"wrote {importer.export_mbox(package, to)}")
        return 0
    for path in patched.export(package, to):
        cli.console.print(f"wrote {path}")
    return 0


@app.command(name="import")
def import_(sources: Annotated[list[str], typer.Argument(help="patch files, an mbox, a quilt folder, git:PATH@A..B",
                                                         show_default=False)],
            patches: PatchesOpt = DEFAULT_PATCHES_DIR,
            start: Annotated[str | None, typer.Option(help="first new id (default: after the last one taken)")]
            = None,
            base: Annotated[str, typer.Option(help="the vLLM the patches were made on: wheel | wheel:cpu | "
                                              "wheel:X.Y.Z | image:REF | dir:PATH")] = "wheel",
            base_sha256: BaseShaOpt = None,
            dry_run: Annotated[bool, typer.Option("--dry-run", help="print the table, write nothing")] = False,
            ignore_index: Annotated[bool, typer.Option(
                "--ignore-index", help="trust the context when index lines match no baseline (said in the header)")]
            = False,
            include: Annotated[list[str], typer.Option(help="keep only files matching this glob (repeat)")] = [],
            exclude: Annotated[list[str], typer.Option(help="leave out files matching this glob (repeat)")] = [],
            strip: Annotated[int | None, typer.Option("-p", min=0, help="path components to strip in plain diffs "
                                                                        "[1]")] = None,
            as_json: JsonOpt = False) -> int:
    """Bring patches made elsewhere into the stack: each must apply, in order, after the stack on the base."""
    options = importer.ImportOptions(ignore_index, importer.PathFilter(tuple(include), tuple(exclude)), strip)
    try:
        result = importer.import_patches(sources, load_pins(), patches_dir=patches, base=base, start=start,
                                         dry_run=dry_run, base_sha256=base_sha256, options=options)
    except UserError as error:
        if as_json:  # JSON out in every outcome, refusals included
            print_json(importer.refused(error, base, patches, dry_run).to_json())
        raise
    if as_json:
        print_json(result.to_json())
    print_result(result, cli.console)
    if result.error:
        raise UserError(result.error)
    return 0


@app.command()
def diff(package: PackageArg) -> int:
    """Print the single combined diff of the stack against the baseline."""
    sys.stdout.write(patched.combined_diff(package))
    return 0


@app.command()
def port(to: Annotated[str | None, typer.Option("--to", help="a vLLM release, e.g. 0.33.0, or latest")] = None,
         source: FromOpt = "wheel", patches: PatchesOpt = DEFAULT_PATCHES_DIR, as_json: JsonOpt = False,
         sha256: Annotated[str | None, typer.Option(help="expected sha256 of the new wheel")] = None,
         base: Annotated[str | None, typer.Option(help="the vLLM the stack was made on, if not the pin: "
                                                  "wheel:X.Y.Z | image:REF | dir:PATH")] = None,
         base_sha256: BaseShaOpt = None,
         cont: Annotated[bool, typer.Option("--continue", help="go on after fixing a conflict")] = False,
         skip: Annotated[bool, typer.Option("--skip", help="drop the conflicting patch, go on")] = False,
         abort: Annotated[bool, typer.Option("--abort", help="remove the port: back to before it")] = False,
         report_only: Annotated[bool, typer.Option("--report-only", help="walk the whole stack, keep nothing")] = False,
         write: Annotated[bool, typer.Option("--write", help="accept a finished port into patches/ and versions.env")]
         = False,
         work: Annotated[Path, typer.Option(help="folder for port work areas")] = Path("build")) -> int:
    """Port the stack to another vLLM release with 3-way merges; resumable like `git am -3`."""
    try:
        action = porting.action_of(cont, skip, abort, report_only, write)
        root = work.absolute()
        with lock.target_lock(root / porting.LOCK_DIR, root, "port"):
            report = porting.port(action, load_pins(), to=to, source=source, patches_dir=patches, sha256=sha256,
                                  work_root=work, base=base, base_sha256=base_sha256)
    except UserError as error:
        if as_json:  # JSON out in every outcome, refusals included
            print_json(porting.PortReport(None, None, error=str(error)).to_json())
        raise
    if as_json:
        print_json(report.to_json())
    print_report(report, cli.console)
    if report.error:
        raise UserError(report.error)
    return 0

