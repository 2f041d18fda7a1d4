"""The command layer: one module per concern, each declaring typer options over one library call.

rigstack.main puts them together as the `rigstack` command; apply.py, preflight.py and scripts/*.py are shims that
run one module's app, so the documented commands keep working.
"""

from __future__ import annotations

import sys
from typing import NoReturn

import typer

from rigstack import cli


def entry(app: typer.Typer) -> NoReturn:
    """What a shim runs: the app, one line for a user error, its exit code."""
    sys.exit(cli.run(app))
