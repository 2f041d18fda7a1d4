"""The check protocol: a Result per check, a Context with what checks read (computed once, lazily), a registry."""

from __future__ import annotations

import enum
import json
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

from rigstack.errors import UserError
from rigstack.preflight import knowledge as vllm_knowledge
from rigstack.preflight import nvml
from rigstack.profiles import Profile
from rigstack.render import profile_env
from rigstack.stack import Stack, load_stack
from rigstack.stamp import Stamp, read_stamp


class Status(str, enum.Enum):
    PASS = "PASS"
    WARN = "WARN"
    FAIL = "FAIL"
    SKIP = "SKIP"


@dataclass(frozen=True)
class Result:
    check: str
    status: Status
    reason: str  # one line: what was found
    fix: str = ""  # one line: what to run or change; empty when nothing is to be done

    def as_json(self) -> dict[str, str]:
        return {"check": self.check, "status": self.status.value, "reason": self.reason, "fix": self.fix}


# Checks build results without their name; the runner stamps the registered name on.
def passed(reason: str) -> Result:
    return Result("", Status.PASS, reason)


def warn(reason: str, fix: str) -> Result:
    return Result("", Status.WARN, reason, fix)


def fail(reason: str, fix: str) -> Result:
    return Result("", Status.FAIL, reason, fix)


def skip(reason: str) -> Result:
    return Result("", Status.SKIP, reason)


@dataclass
class Context:
    """Everything a check reads. The costly parts (NVML, the model config, vLLM's flags) load on first use."""

    profile: Profile
    model: Path | None  # the model folder on this host (None: the tiny model is not built yet)
    package: Path | None  # the vllm package preflight checks (None: none found)
    environ: dict[str, str] = field(default_factory=lambda: dict(os.environ))
    python: str | None = None  # the interpreter that serves the package (None: its venv's, else this one)
    model_problem: str = ""  # why the model folder could not be located (then model is None)

    @cached_property
    def gpus(self) -> nvml.GpuScan:
        return nvml.scan()

    @cached_property
    def model_config(self) -> dict[str, Any] | None:
        return read_config(self.model)

    @cached_property
    def stack(self) -> Stack:
        """The patch stack; a broken patches/ folder raises UserError, which the runner shows as the check's FAIL."""
        return load_stack()

    @cached_property
    def stamp(self) -> Stamp | None:
        return read_stamp(self.package) if self.package else None

    @cached_property
    def patched_modules(self) -> list[str]:
        """The modules the stamped patches touch (all of the stack's when unstamped): they must import."""
        try:
            stack, stamp = self.stack, self.stamp
        except UserError:
            return []
        if stamp:
            ids = set(stamp.patch_ids)
            touched = [path for patch in stack.patches if patch.id in ids for path in patch.touched_files]
        else:  # unpatched: the stamp check already fails; files the stack would add cannot import yet
            touched = [path for patch in stack.patches for path in patch.touched_files
                       if self.package and (self.package / path).is_file()]
        return vllm_knowledge.module_names(touched)

    @cached_property
    def knowledge(self) -> vllm_knowledge.Knowledge:
        return vllm_knowledge.load(self.package, self.patched_modules, self.python)

    def env_value(self, name: str) -> str | None:
        """A variable as the server will see it: the profile's value wins over the caller's environment."""
        return profile_env(self.profile).get(name, self.environ.get(name))


def read_config(folder: Path | None) -> dict[str, Any] | None:
    """A model folder's config.json; None when there is none or it is unreadable (the model check says which)."""
    try:
        data = json.loads((folder / "config.json").read_text()) if folder else None
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


Check = Callable[[Context], Result]
CHECKS: list[tuple[str, Check, bool]] = []  # name, function, slow


def check(name: str, slow: bool = False) -> Callable[[Check], Check]:
    """Register a check. Checks run in registration order, the slow ones (a vLLM subprocess) after all others."""

    def register(function: Check) -> Check:
        CHECKS.append((name, function, slow))
        return function

    return register
