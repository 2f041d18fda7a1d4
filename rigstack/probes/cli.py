"""What the probe scripts share: their common options (declared once), the target server, and publishing results."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from rigstack.cli import console
from rigstack.client import Endpoint, Server, api_key_from_env
from rigstack.probes.results import Result, write_result

Url = Annotated[str, typer.Option("--url", help="OpenAI-compatible server, e.g. http://127.0.0.1:8000/v1")]
Model = Annotated[str, typer.Option("--model", help="served model name (see GET /v1/models)")]
ApiKeyEnv = Annotated[str | None, typer.Option("--api-key-env", help="env var holding the API key (never printed)")]
Profile = Annotated[str | None, typer.Option("--profile", help="profile the server runs, recorded in the result")]
Package = Annotated[Path | None, typer.Option(
    "--package", help="the vllm package the server runs, for the stack hash (default: the importable vllm when "
                      "the server is local)")]
Timeout = Annotated[float, typer.Option("--timeout", help="seconds per request")]


@dataclass(frozen=True)
class Target:
    url: str
    model: str
    api_key_env: str | None = None
    profile: str | None = None
    package: Path | None = None
    timeout_s: float = 600.0

    def server(self) -> Server:
        return Server(Endpoint(self.url, self.model, api_key_from_env(self.api_key_env)), self.timeout_s)


def publish(result: Result, out: Path, plot: Callable[[Result, Path], None] | None = None) -> None:
    """Write the result files and show its metrics and notes (on stderr: stdout stays free for pipes)."""
    written = write_result(result, out, plot)
    table = Table(title=f"{result.kind} @ {result.provenance.url} ({result.provenance.model})")
    table.add_column("metric")
    table.add_column("value", justify="right")
    for name, metric in result.metrics.items():
        value = "-" if metric.value is None else f"{metric.value:.4g} {metric.unit}".strip()
        table.add_row(name, value)
    console.print(table)
    for note in result.notes:
        console.print(f"note: {note}")
    console.print("wrote " + ", ".join(str(path) for path in written))
