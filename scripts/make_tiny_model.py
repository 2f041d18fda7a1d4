"""Build (or find in the cache) the tiny seeded model that cpu-tiny serves, and print its folder."""

from __future__ import annotations

import sys
from typing import Annotated

import typer


from rigstack import cli
from rigstack.tinymodel import KINDS, build_tiny_model

app = typer.Typer(add_completion=False, help=__doc__)


@app.command()
def main(kind: Annotated[str, typer.Option(help=f"one of: {', '.join(KINDS)}")] = "dense",
         seed: Annotated[int, typer.Option(help="weight seed; each seed is its own cached model")] = 0) -> None:
    print(build_tiny_model(kind, seed))


if __name__ == "__main__":
    sys.exit(cli.run(app))
