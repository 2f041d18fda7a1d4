"""Probe results: one versioned JSON with provenance, a CSV of its rows, and a PNG where there is a sweep or grid.

Every metric carries the direction that counts as better, so compare.py needs no per-probe knowledge.
"""

from __future__ import annotations

import csv
import importlib.util
import io
import json
import math
import os
import platform
import subprocess
import sys
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import datetime, UTC
from pathlib import Path
from typing import Any, Literal
from urllib.parse import urlparse

from pydantic import BaseModel, ConfigDict, Field, ValidationError

import rigstack
from rigstack.atomic import replacing, write_atomic
from rigstack.client import Server
from rigstack.endpoint import Endpoint, redact
from rigstack.errors import UserError
from rigstack.files import read_regular
from rigstack.serving.process import running
from rigstack.serving.runrecord import DEFAULT_RUN_DIR, RECORD_NAME, RunRecord
from rigstack.stamp import Stamp, read_stamp

SCHEMA_VERSION = 1
RESULT_LIMIT = 256 << 20  # a sweep's result is a few MB; far below what would take a host's memory
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
    # Why package, stack_hash, patches or profile are unknown, when they are (never null without a reason).
    note: str | None = None
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


@dataclass(frozen=True)
class Served:
    """What runs behind the url: where its vllm package is, the package's stamp, the profile, and why any is
    unknown."""
    package: str | None
    stamp: Stamp | None
    profile: str | None = None
    note: str | None = None


def serving_record(url: str, root: Path = DEFAULT_RUN_DIR) -> RunRecord | None:
    """The live record, anywhere under root (the launcher's run folders), of the server on this host that holds
    url's port; None when rigstack did not start it there."""
    port = urlparse(url).port
    for path in sorted(root.rglob(RECORD_NAME)) if root.is_dir() else ():
        try:
            record = running(path.parent)
        except UserError:  # an unreadable record elsewhere is not this server's
            continue
        if record is not None and record.container is None and urlparse(record.url).port == port:
            return record
    return None


def recorded_package(record: RunRecord) -> Path | None:
    """The vllm package a server the launcher started imports: asked of its own interpreter (argv[0], with the
    record's env), which finds it without importing it."""
    code = "import importlib.util as u; s = u.find_spec('vllm'); print(s.origin if s and s.origin else '')"
    try:
        done = subprocess.run([record.argv[0], "-c", code], capture_output=True, text=True, timeout=60,
                              env={**os.environ, **record.env}, check=True)
    except (OSError, subprocess.SubprocessError, IndexError):
        return None
    origin = done.stdout.strip()
    return Path(origin).parent if origin else None


def _stamped(where: str, stamp: Stamp | None, profile: str | None = None) -> Served:
    note = None if stamp else f"{where} has no rigstack stamp (not patched by apply.py): stack_hash and patches unknown"
    return Served(where, stamp, profile, note)


def served_package(package: Path | None, url: str) -> Served:
    """What the server runs: the container that publishes the url's port on this host (a docker profile), else the
    server the launcher started on that port (its run record: interpreter and profile), else --package or the
    importable one."""
    local = urlparse(url if "://" in url else f"http://{url}").hostname in LOCAL_HOSTS
    if package is None and local:
        from rigstack.rigimages import container_stamp  # the docker SDK only when a server is local

        inside = container_stamp(url)
        if inside is not None:
            return _stamped(*inside)
        record = serving_record(url)
        if record is not None:
            found = recorded_package(record)
            if found is None:
                return Served(None, None, record.profile, f"the server's interpreter {record.argv[0]} (run record "
                              f"{record.log.rsplit('/', 1)[0]}) names no vllm package: stack_hash and patches unknown")
            return _stamped(str(found), read_stamp(found), record.profile)
    found = find_package(package, url)
    if found is not None:
        return _stamped(str(found), read_stamp(found))
    why = ("the server is not on this host" if not local else
           "no run record of the launcher holds its port and this interpreter has no vllm")
    return Served(None, None, None, f"{why}: package, stack_hash, patches and profile unknown; pass --package (and "
                                    "--profile) to record them")


def provenance(server: Server, profile: str | None, package: Path | None, params: dict[str, Any]) -> Provenance:
    endpoint: Endpoint = server.endpoint
    served = served_package(package, endpoint.base)
    stamp = served.stamp
    return Provenance(url=endpoint.base, model=endpoint.model, profile=profile or served.profile,
                      server_version=server.version(), package=served.package,
                      stack_hash=stamp.stack_hash if stamp else None, patches=stamp.patch_ids if stamp else (),
                      vllm_version=stamp.vllm_version if stamp else None, argv=endpoint.redact(tuple(sys.argv)),
                      params=params, note=served.note)


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
    # Owner-only: a result names its server and command line, which a caller may have given a credential in.
    write_atomic(written[0], json.dumps(result.model_dump(mode="json"), indent=2) + "\n", private=True)
    if result.rows:
        written.append(write_atomic(out.with_suffix(".csv"), rows_csv(result.rows), private=True))
    if plot is not None:
        with replacing(out.with_suffix(".png")) as tmp:
            plot(result, tmp)
        written.append(out.with_suffix(".png"))
    return written


def load_result(path: Path) -> Result:
    """A result file, or a one-line UserError saying what is wrong with it."""
    if not path.exists():
        raise UserError(f"{path}: no such result file; run a probe with --out {path.with_suffix('')}")
    # A regular file of bounded size: a FIFO or /dev/zero given by mistake must not hold the command forever.
    text = read_regular(path, "result file", RESULT_LIMIT, "pass a .json file a probe wrote").decode(errors="replace")
    if not text.strip():
        raise UserError(f"{path}: empty file; rerun the probe that writes it")
    try:
        raw = json.loads(text)
    except json.JSONDecodeError as error:
        raise UserError(f"{path}: not JSON ({error.msg} at line {error.lineno}); rerun the probe that writes it") \
            from None
    except RecursionError:  # nesting no probe writes, past what Python's parser can descend
        raise UserError(f"{path}: JSON nested too deep to be a probe result; pass a file a probe wrote") from None
    if not isinstance(raw, dict) or "schema_version" not in raw:
        raise UserError(f"{path}: not a rigstack probe result (no schema_version); pass a file a probe wrote")
    if raw["schema_version"] != SCHEMA_VERSION:
        raise UserError(f"{path}: result schema {raw['schema_version']}, this tool reads {SCHEMA_VERSION}; "
                        "rerun the probe with this version")
    metrics = raw.get("metrics")
    for name, metric in (metrics.items() if isinstance(metrics, dict) else ()):
        value = metric.get("value") if isinstance(metric, dict) else None
        # A probe writes a number or null; "12", true, NaN or Infinity would slip through a comparison unjudged.
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))
                                  or not math.isfinite(value)):
            raise UserError(f"{path}: metric {name} is {value!r}, not a finite number; rerun the probe that "
                            "writes it")
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
