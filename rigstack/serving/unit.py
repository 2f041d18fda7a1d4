"""What a launcher starts, as data: a Unit is one server process (its run folder, command, environment and URL).

    Unit(run_dir, argv, env, url, container=None)
    probe_url(host, port) -> str: the URL a server listening there is reached at.
    format_command(argv, env) -> str: a unit's launch as one shell command, for the dry runs.
"""

from __future__ import annotations

import shlex
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path


def probe_url(host: str, port: int) -> str:
    """The URL a server listening on host:port is reached at; one bound to all interfaces through loopback."""
    return f"http://{'127.0.0.1' if host in ('0.0.0.0', '::', '') else host}:{port}"


@dataclass(frozen=True)
class Unit:
    """One server process: a profile's only one, one replica (seed 004's TP2 units), a router, a gateway."""

    run_dir: Path
    argv: list[str]
    env: dict[str, str]
    url: str
    container: str | None = None
    profile: str | None = None  # the profile the unit serves, recorded for the probes' provenance


def format_command(argv: Sequence[str], env: dict[str, str]) -> str:
    """The launch as one shell command that runs as is when pasted: `env K=V ... program args`, the env overlaid
    on the current one as the launcher does, every word shell-quoted, one option per continued line."""
    command: list[list[str]] = []
    for arg in argv:
        # The program and its first words share a line; then one line per option and its values.
        if not command or arg.startswith("-"):
            command.append([])
        command[-1].append(arg)
    prefix = [["env", *(f"{key}={value}" for key, value in env.items())]] if env else []
    return " \\\n  ".join(" ".join(map(shlex.quote, group)) for group in [*prefix, *command])
