"""The stamp: the one fact about a patched package that every later step (preflight, images, probes) reads."""

from __future__ import annotations

import json
import os
from pathlib import Path

from pydantic import BaseModel, ConfigDict, ValidationError

from rigstack.errors import UserError

STAMP_NAME = "rigstack_stamp.json"
STAMP_SCHEMA = 1


class StampedPatch(BaseModel):
    model_config = ConfigDict(frozen=True)

    id: str
    file: str
    sha256: str
    status: str


class Stamp(BaseModel):
    model_config = ConfigDict(frozen=True)

    schema_version: int = STAMP_SCHEMA
    tool_version: str
    vllm_version: str
    flavour: str
    source: str
    baseline_fingerprint: str
    baseline_commit: str
    head_commit: str
    stack_hash: str
    patches: tuple[StampedPatch, ...]

    @property
    def patch_ids(self) -> tuple[str, ...]:
        return tuple(patch.id for patch in self.patches)


def stamp_path(package: Path) -> Path:
    return package / STAMP_NAME


def read_stamp(package: Path) -> Stamp | None:
    """The package's stamp, or None when it was never patched by rigstack."""
    path = stamp_path(package)
    if not path.is_file():
        return None
    try:
        return Stamp.model_validate_json(path.read_text())
    except ValidationError as error:
        raise UserError(f"{path}: unreadable stamp ({error.errors()[0]['msg']}); "
                        f"rerun `python apply.py apply --from dir:{package}`") from None


def write_stamp(package: Path, stamp: Stamp) -> None:
    path = stamp_path(package)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(stamp.model_dump(mode="json"), indent=2, sort_keys=True) + "\n")
    os.replace(tmp, path)
