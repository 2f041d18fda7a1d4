"""versions.env: every pin in one file, parsed in one place into an immutable record."""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, fields
from pathlib import Path

from rigstack import treeswap
from rigstack.atomic import write_atomic
from rigstack.errors import UserError

REPO_ROOT = Path(__file__).resolve().parent.parent
VERSIONS_FILE = REPO_ROOT / "versions.env"

FLAVOURS = ("gpu", "cpu")
# What makes a folder a rigstack checkout (the one REPO_ROOT names, or a clone beside it).
_CHECKOUT_MARKS = ("versions.env", "apply.py", "rigstack/__init__.py")
TWIN = "twin"  # VLLM_CPU_WHEEL's value when the CPU flavour is built from the sdist
# vcs-versioning writes `__version__ = version = '0.32.0'`; older setuptools-scm only `__version__ = '...'`.
_VERSION_LINE = re.compile(r"__version__\s*=\s*(?:version\s*=\s*)?['\"]([^'\"]+)")


@dataclass(frozen=True)
class Pins:
    vllm_version: str
    vllm_wheel: str
    vllm_wheel_sha256: str
    vllm_cpu_wheel: str
    vllm_cpu_wheel_sha256: str
    vllm_sdist: str
    vllm_sdist_sha256: str
    vllm_fingerprint_gpu: str
    vllm_fingerprint_cpu: str
    vllm_image: str
    vllm_image_digest: str
    vllm_image_package_path: str
    torch_version: str
    onednn_src: str
    onednn_src_sha256: str

    @property
    def cpu_is_twin(self) -> bool:
        """No vllm-cpu release carries this vLLM: the CPU flavour is built from the sdist (rigstack.twin)."""
        return self.vllm_cpu_wheel == TWIN

    def wheel(self, flavour: str) -> tuple[str, str, str]:
        """(distribution name, wheel file name, sha256) of one flavour."""
        if flavour == "gpu":
            return "vllm", self.vllm_wheel, self.vllm_wheel_sha256
        return "vllm-cpu", self.vllm_cpu_wheel, self.vllm_cpu_wheel_sha256

    def fingerprint(self, flavour: str) -> str:
        return self.vllm_fingerprint_gpu if flavour == "gpu" else self.vllm_fingerprint_cpu

    @property
    def image_ref(self) -> str:
        """The base image, by digest when one is pinned."""
        if self.vllm_image_digest:
            return f"{self.vllm_image.split(':')[0]}@{self.vllm_image_digest}"
        return self.vllm_image


def parse_env_file(path: Path) -> dict[str, str]:
    """KEY=VALUE lines with shell quoting; comments and blank lines skipped."""
    values: dict[str, str] = {}
    for number, line in enumerate(path.read_text().splitlines(), start=1):
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        key, sep, raw = stripped.partition("=")
        if not sep or not key.isidentifier():
            raise UserError(f"{path}:{number}: expected KEY=VALUE, got {stripped!r}; fix the line")
        parts = shlex.split(raw, comments=True)
        values[key] = parts[0] if parts else ""
    return values


def load_pins(path: Path = VERSIONS_FILE) -> Pins:
    treeswap.recover(path.parent)  # a port --write killed half way is finished first
    if not path.is_file():
        raise UserError(f"{path} not found; run from a rigstack checkout")
    values = parse_env_file(path)
    wanted = {field.name.upper(): field.name for field in fields(Pins)}
    missing = sorted(set(wanted) - set(values))
    if missing:
        raise UserError(f"{path}: missing {', '.join(missing)}; add the pin")
    return Pins(**{name: values[key] for key, name in wanted.items()})


def update_pins(changes: dict[str, str], path: Path = VERSIONS_FILE, into: Path | None = None) -> None:
    """Rewrite the given keys, keeping comments and order, in place or into another file (port --write stages the
    new versions.env beside the old one)."""
    lines = path.read_text().splitlines(keepends=True)
    pending = dict(changes)
    for index, line in enumerate(lines):
        key = line.partition("=")[0].strip()
        if key in pending:
            value = pending.pop(key)
            lines[index] = f"{key}={shlex.quote(value) if value else ''}\n"  # empty stays `KEY=`, as written
    if pending:
        raise UserError(f"{path}: no line for {', '.join(sorted(pending))}; add the keys first")
    write_atomic(into or path, "".join(lines))


def package_version(version_py: str) -> str | None:
    """The version a vLLM package's `_version.py` declares, local part kept ("0.32.0+cpu"); None when it has none."""
    match = _VERSION_LINE.search(version_py)
    return match.group(1) if match else None


def release_of(version: str) -> str:
    """The release both flavours' wheels are cut from: "0.32.0+cpu" -> "0.32.0"."""
    return version.split("+", 1)[0]


def checkout_of(folder: Path) -> Path | None:
    """The rigstack checkout holding `folder`, if any."""
    for candidate in (folder, *folder.parents):
        if all((candidate / mark).is_file() for mark in _CHECKOUT_MARKS):
            return candidate
    return None


def refuse_another_checkout(cwd: Path) -> None:
    """Commands act on REPO_ROOT (the checkout whose rigstack is imported: a venv's editable install names one).
    Run from inside a different checkout, they would read that one's patches/ and versions.env no more than they
    would write them: `port --write` would rewrite the first checkout's stack. Refused, naming both."""
    other = checkout_of(cwd)
    if other is not None and other.resolve() != REPO_ROOT:
        raise UserError(f"this rigstack acts on the checkout at {REPO_ROOT}, but you are inside another one, {other}; "
                        f"run that checkout's own (`cd {other} && make apply`, then its .venv/bin/rigstack, or "
                        f"`python {other}/apply.py`), or run this one from outside {other}")
