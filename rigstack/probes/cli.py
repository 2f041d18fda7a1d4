"""What the probe scripts share: their common options (declared once), the target server, and publishing results."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, UTC
from pathlib import Path
from typing import Annotated

import typer

from rigstack.atomic import check_writable
from rigstack.client import Server
from rigstack.endpoint import Endpoint, api_key_from_env
from rigstack.errors import UserError
from rigstack.probes.results import Result, redacted, write_result
from rigstack.probes.streak import STOP_AFTER

# The repository's results/ folder (git-ignored): a probe run never litters the working tree.
RESULTS_DIR = Path(__file__).resolve().parents[2] / "results"
# Requests failed, so part of the probe measured nothing: distinct from a finding (2) and a user error (1).
EXIT_FAILED = 4

Url = Annotated[str, typer.Option("--url", help="OpenAI-compatible server, e.g. http://127.0.0.1:8000/v1")]
Model = Annotated[str, typer.Option("--model", help="served model name (see GET /v1/models)")]
ApiKeyEnv = Annotated[str | None, typer.Option("--api-key-env", help="env var holding the API key (never printed)")]
Profile = Annotated[str | None, typer.Option("--profile", help="profile the server runs, recorded in the result")]
Package = Annotated[Path | None, typer.Option(
    "--package", help="the vllm package the server runs, for the stack hash (default: the importable vllm when "
                      "the server is local)")]
Timeout = Annotated[float, typer.Option("--timeout", help="seconds per request (a deadline for the whole answer)")]
StopAfter = Annotated[int, typer.Option("--stop-after-failures", min=0, help="stop a workload (or level) after this "
                                        "many failed requests in a row; 0 sends every request")]
Out = Annotated[Path | None, typer.Option(help="result stem: writes OUT.json, OUT.csv (and OUT.png for sweeps); "
                                               "default results/KIND-<UTC time> in the repository")]
Fleet = Annotated[str | None, typer.Option(
    "--fleet", help="the fleet whose gateway --url is: the server-side counters, /version and /tokenize are read from "
                    "the engines that serve --model")]


@dataclass(frozen=True)
class Target:
    url: str
    model: str
    api_key_env: str | None = None
    profile: str | None = None
    package: Path | None = None
    timeout_s: float = 600.0
    stop_after: int = STOP_AFTER  # failed requests in a row that end a workload (rigstack.probes.streak)
    fleet: str | None = None

    def server(self) -> Server:
        from rigstack.fleets import engine_urls, load_fleet  # only probes of a fleet read one

        engines = engine_urls(load_fleet(self.fleet), self.model) if self.fleet else ()
        return Server(Endpoint(self.url, self.model, api_key_from_env(self.api_key_env)), self.timeout_s, engines)


def default_out(kind: str, out: Path | None) -> Path:
    """--out, else a fresh stem in results/ (a timestamp per run, so an earlier result is never overwritten); asked
    for before the probe runs, so that a place the result cannot be written is said before minutes of measuring."""
    stem = out if out is not None else RESULTS_DIR / f"{kind}-{datetime.now(UTC):%Y%m%dT%H%M%SZ}"
    check_writable(stem.with_suffix(".json"), "the result file", "give --out a stem in a folder you can write")
    return stem


@dataclass(frozen=True)
class Published:
    """A probe's result as written and shown (the server's credentials blanked) and the files it went to."""

    result: Result
    written: list[Path]


# How a probe's command shows a published result (rigstack/output/probes.py: show_published).
Show = Callable[[Published], None]


def publish(result: Result, out: Path, server: Server, plot: Callable[[Result, Path], None] | None = None) -> Published:
    """Write the result files; the server's credentials are blanked in everything written and returned to show."""
    shown = redacted(result, server.endpoint.secrets)
    return Published(shown, write_result(shown, out, plot))


def requests_failed(what: str, error: str | None) -> UserError:
    """The one-line error for failed requests, with the server's message; exit code EXIT_FAILED."""
    return UserError(f"{what} ({error or 'no message'}); a failed request measures nothing (the result files "
                     "list them)", exit_code=EXIT_FAILED)


def fail_if_unmeasured(groups: list[str], error: str | None) -> int:
    """0 when every group (workload, level, ...) got at least one answer; else raise requests_failed."""
    if groups:
        raise requests_failed(f"every request of {', '.join(groups)} failed", error)
    return 0
