"""Probe results: one versioned JSON with provenance, a CSV of its rows, and a PNG where there is a sweep or grid.

Every metric carries the direction that counts as better, so compare.py needs no per-probe knowledge.
"""

from __future__ import annotations

import csv
import importlib.util
import io
import json
import platform
import sys
from collections import Counter
from collections.abc import Callable, Iterable
from datetime import datetime, UTC
from pathlib import Path
from typing import Any, Literal
from urllib.parse import urlparse

from pydantic import BaseModel, ConfigDict, Field, ValidationError

import rigstack
from rigstack.atomic import replacing, write_atomic
from rigstack.client import Endpoint, Server, redact
from rigstack.errors import UserError
from rigstack.stamp import Stamp, read_stamp

SCHEMA_VERSION = 1
LOCAL_HOSTS = {"localhost", "127.0.0.1", "::1", "0.0.0.0"}


class Metric(BaseModel):
    model_config = ConfigDict(frozen=True)

    value: float | None
    # "higher"/"lower": which way is better; "equal": any change is a regression (token identity, pass counts).
    better: Literal["higher", "lower", "equal"]
    unit: str = ""


class Provenance(BaseModel):
    model_config = ConfigDict(frozen=True)

    url: str
    model: str
    profile: str | None
    server_version: str | None
    package: str | None
    stack_hash: str | None
    patches: tuple[str, ...] = ()
    vllm_version: str | None = None
    tool_version: str = rigstack.__version__
    python: str = platform.python_version()
    host: str = platform.node()
    argv: tuple[str, ...] = ()
    # The exact request parameters every timed request used (minus prompts), so a rerun can match them.
    params: dict[str, Any] = Field(default_factory=dict)


class Result(BaseModel):
    model_config = ConfigDict(frozen=True)

    schema_version: int = SCHEMA_VERSION
    kind: str
    created: str = Field(default_factory=lambda: datetime.now(UTC).isoformat(timespec="seconds"))
    provenance: Provenance
    metrics: dict[str, Metric]
    rows: list[dict[str, Any]] = Field(default_factory=list)
    notes: list[str] = Field(default_factory=list)
    # Raw per-run outputs (token ids, logprobs) that the fidelity gate compares; kept out of the CSV.
    samples: list[dict[str, Any]] = Field(default_factory=list)


def find_package(package: Path | None, url: str) -> Path | None:
    """The vllm package the server runs: --package, else the importable one when the server is on this host."""
    if package is not None:
        if not (package / "__init__.py").is_file():
            raise UserError(f"{package} is not a vllm package folder (no __init__.py); pass the folder holding "
                            "vLLM's __init__.py to --package")
        return package
    if urlparse(url if "://" in url else f"http://{url}").hostname not in LOCAL_HOSTS:
        return None
    spec = importlib.util.find_spec("vllm")  # locates without importing (importing vllm takes seconds)
    return Path(spec.origin).parent if spec and spec.origin else None


def served_package(package: Path | None, url: str) -> tuple[str | None, Stamp | None]:
    """Where the served package is, and its stamp: inside the container that publishes the url's port on this
    host (a docker profile), else --package or the importable one."""
    if package is None and urlparse(url if "://" in url else f"http://{url}").hostname in LOCAL_HOSTS:
        from rigstack.images import container_stamp  # the docker SDK only when a server is local

        inside = container_stamp(url)
        if inside is not None:
            return inside
    found = find_package(package, url)
    return (str(found) if found else None), (read_stamp(found) if found else None)


def provenance(server: Server, profile: str | None, package: Path | None, params: dict[str, Any]) -> Provenance:
    endpoint: Endpoint = server.endpoint
    where, stamp = served_package(package, endpoint.base)
    return Provenance(url=endpoint.base, model=endpoint.model, profile=profile, server_version=server.version(),
                      package=where, stack_hash=stamp.stack_hash if stamp else None,
                      patches=stamp.patch_ids if stamp else (), vllm_version=stamp.vllm_version if stamp else None,
                      argv=endpoint.redact(tuple(sys.argv)), params=params)


def rows_csv(rows: list[dict[str, Any]]) -> str:
    columns: list[str] = []
    for row in rows:
        columns.extend(key for key in row if key not in columns)
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=columns, lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    return buffer.getvalue()


def redacted(result: Result, secrets: tuple[str, ...]) -> Result:
    """The result with every secret blanked, wherever a server's echo or the command line put it."""
    return Result.model_validate(redact(result.model_dump(mode="json"), secrets)) if secrets else result


def write_result(result: Result, out: Path, plot: Callable[[Result, Path], None] | None = None) -> list[Path]:
    """out is the stem: writes out.json, out.csv (when there are rows) and out.png (when a plot is given)."""
    written = [out.with_suffix(".json")]
    write_atomic(written[0], json.dumps(result.model_dump(mode="json"), indent=2) + "\n")
    if result.rows:
        written.append(write_atomic(out.with_suffix(".csv"), rows_csv(result.rows)))
    if plot is not None:
        with replacing(out.with_suffix(".png")) as tmp:
            plot(result, tmp)
        written.append(out.with_suffix(".png"))
    return written


def load_result(path: Path) -> Result:
    """A result file, or a one-line UserError saying what is wrong with it."""
    if not path.is_file():
        raise UserError(f"{path}: no such result file; run a probe with --out {path.with_suffix('')}")
    text = path.read_text(errors="replace")
    if not text.strip():
        raise UserError(f"{path}: empty file; rerun the probe that writes it")
    try:
        raw = json.loads(text)
    except json.JSONDecodeError as error:
        raise UserError(f"{path}: not JSON ({error.msg} at line {error.lineno}); rerun the probe that writes it") \
            from None
    if not isinstance(raw, dict) or "schema_version" not in raw:
        raise UserError(f"{path}: not a rigstack probe result (no schema_version); pass a file a probe wrote")
    if raw["schema_version"] != SCHEMA_VERSION:
        raise UserError(f"{path}: result schema {raw['schema_version']}, this tool reads {SCHEMA_VERSION}; "
                        "rerun the probe with this version")
    try:
        return Result.model_validate(raw)
    except ValidationError as error:
        first = error.errors()[0]
        where = ".".join(str(part) for part in first["loc"])
        raise UserError(f"{path}: malformed result ({where}: {first['msg']}); rerun the probe that writes it") \
            from None


def percentiles(values: list[float], points: tuple[int, ...] = (50, 90, 99)) -> dict[str, float | None]:
    """p50/p90/p99 (linear interpolation, as numpy does); None for an empty list."""
    import numpy

    if not values:
        return {f"p{point}": None for point in points}
    return {f"p{point}": float(numpy.percentile(values, point)) for point in points}


def mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


def failure_notes(errors: Iterable[str | None]) -> list[str]:
    """The five commonest failure messages with their counts, for the notes."""
    return [f"{count} failed: {error}" for error, count in Counter(errors).most_common(5)]
