"""How results look: the library returns data, these modules render it (rich tables for people, JSON for
machines), one module per kind of output. Results go to stdout; rigstack.cli.console (stderr) is for people."""

from __future__ import annotations

import json
import sys

from rich.console import Console

stdout = Console(highlight=False, soft_wrap=True)


_printed: list[object] = []  # a mark per JSON document printed: cli.run prints an error's where a run printed none


def print_json(data: object) -> None:
    sys.stdout.write(json.dumps(data, indent=2, sort_keys=True, default=str) + "\n")
    _printed.append(True)


def json_printed() -> int:
    """How many JSON documents this process has printed so far."""
    return len(_printed)
