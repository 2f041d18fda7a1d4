"""The stamp: the one fact about a patched package that every later step (preflight, images, probes) reads."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, fields
from pathlib import Path

from rigstack.atomic import write_atomic
from rigstack.errors import UserError
from rigstack.invocation import command

STAMP_NAME = "rigstack_stamp.json"
STAMP_SCHEMA = 1


# Plain frozen dataclasses, not pydantic: the stamp is read on apply.py's warm path, which must stay well under 1 s.
@dataclass(frozen=True)
class StampedPatch:
    id: str
    file: str
    sha256: str
    status: str


@dataclass(frozen=True)
class Stamp:
    tool_version: str
    vllm_version: str
    flavour: str
    source: str
    baseline_fingerprint: str
    baseline_commit: str
    head_commit: str
    stack_hash: str
    patches: tuple[StampedPatch, ...]
    schema_version: int = STAMP_SCHEMA

    @property
    def patch_ids(self) -> tuple[str, ...]:
        return tuple(patch.id for patch in self.patches)

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> Stamp:
        """Strict: a missing or unknown key, or a wrong schema version, is an error."""
        known = {field.name for field in fields(cls)}
        if set(data) - known or data.get("schema_version", STAMP_SCHEMA) != STAMP_SCHEMA:
            raise ValueError(f"unknown keys {sorted(set(data) - known)} or schema {data.get('schema_version')}")
        patches = tuple(StampedPatch(**patch) for patch in data.get("patches", ()))
        return cls(**{**data, "patches": patches})


def stamp_path(package: Path) -> Path:
    return package / STAMP_NAME


def load_stamp(package: Path) -> tuple[Stamp | None, str | None]:
    """(the package's stamp, None), or (None, what is wrong with it): "missing stamp", "unreadable stamp (...)"."""
    path = stamp_path(package)
    if not path.is_file():
        return None, "missing stamp"
    try:
        return Stamp.from_dict(json.loads(path.read_text())), None
    except (ValueError, TypeError, AttributeError) as error:  # not JSON, not an object, wrong keys or types
        return None, f"unreadable stamp ({str(error)[:120]})"


def read_stamp(package: Path) -> Stamp | None:
    """The package's stamp, or None when it was never patched by rigstack."""
    stamp, problem = load_stamp(package)
    if stamp is None and problem != "missing stamp":
        # apply rebuilds a stamp from the package's git history, so it is the fix (rigstack.history).
        raise UserError(f"{stamp_path(package)}: {problem}; rerun `{command(f'apply --from dir:{package}')}`")
    return stamp


def write_stamp(package: Path, stamp: Stamp) -> None:
    write_atomic(stamp_path(package), json.dumps(stamp.to_dict(), indent=2, sort_keys=True) + "\n")
