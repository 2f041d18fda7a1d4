"""The state of a port (port.json), its report, and where a port's work area is."""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from pathlib import Path

from pydantic import BaseModel

from rigstack import __version__, applier, invocation
from rigstack.atomic import write_atomic
from rigstack.errors import UserError
from rigstack.gitrepo import PackageRepo
from rigstack.versions import package_version, release_of

STATE = "port.json"
LOCK_DIR = ".port.rigstack"  # holds apply.py's lock: one port at a time per work folder
PORTED = "ported-patches"
OLD_BASELINE = "refs/port/old-baseline"
OLD_STACK = "refs/port/old-stack"
NEW_BASELINE = "refs/port/new-baseline"
CPU_BASELINE = "refs/port/cpu-baseline"
ACTIONS = ("start", "continue", "skip", "abort", "report-only", "write")
WRITABLE = ("clean", "refreshed", "moved", "upstreamed", "dropped")
DEFAULT_WORK_ROOT = Path("build")  # `port --work`'s default, under the folder it runs in


class ConflictSite(BaseModel):
    file: str  # vllm/...
    hunk: str  # which hunk of the old patch, e.g. "hunk 2 (line 120 in 0.32.0)"
    lines: str  # lines of the merged file (as the work tree holds it) inside the conflict markers


class PortedPatch(BaseModel):
    id: str
    file: str
    status: str = "pending"  # clean, refreshed, upstreamed, moved, conflict, waiting (report only), dropped
    detail: str = ""
    files: list[str] = []
    moved: dict[str, str] = {}  # old path -> new path
    conflicts: list[ConflictSite] = []
    upstream_lines: list[int] = []  # a conflict: [lines it adds that the new release already has, lines it adds]
    drift: list[str] = []
    commit: str | None = None


class Baseline(BaseModel):
    version: str
    source: str
    flavour: str
    wheel: str | None = None
    sha256: str | None = None
    fingerprint: str
    commit: str


class PortState(BaseModel):
    schema_version: int = 1
    tool_version: str = __version__
    status: str  # running, stopped (a conflict is open), done, written
    report_only: bool = False
    old: Baseline
    new: Baseline
    patches_dir: str
    stack_hash: str
    old_commits: list[str]
    head: str
    next: int = 0
    patches: list[PortedPatch]
    conflict_tree: str | None = None
    laid: bool = False  # whether the work tree holds files (the first conflict or the end of the port lays it)
    cpu: dict[str, str] = {}
    notes: list[str] = []


@dataclass(frozen=True)
class PortReport:
    work: str | None
    state: PortState | None
    error: str | None = None
    instructions: tuple[str, ...] = ()
    message: str = ""
    old_stack: applier.StackResult | None = None  # the stack on the pinned release, when it does not apply there

    def to_json(self) -> dict:
        """One shape for every outcome: a port's state, or (when there is none) status "failed" and the error, or
        "up-to-date" (`--to latest` when the pin is the newest release)."""
        state = (self.state.model_dump(mode="json") if self.state
                 else {"status": "failed" if self.error else "up-to-date"})
        old = {"old_stack": self.old_stack.to_json()} if self.old_stack else {}
        return {"work": self.work, "error": self.error, "next_steps": list(self.instructions), "message": self.message,
                **state, **old}


class _NotOnThePin(UserError):
    """The stack does not apply to the release it is pinned to: there is nothing to port yet."""

    def __init__(self, result: applier.StackResult, baseline: str) -> None:
        super().__init__(f"the stack does not apply to {baseline}, so it cannot be ported: {result.error}")
        self.result = result


def _repo(work: Path) -> PackageRepo:
    return PackageRepo((work / "vllm").absolute())


def _save(work: Path, state: PortState) -> None:
    write_atomic(work / STATE, state.model_dump_json(indent=2).encode())


def _load(work: Path) -> PortState:
    return PortState.model_validate_json((work / STATE).read_text())


def port_command(work_root: Path, words: str) -> str:
    """`rigstack port WORDS` as the user types it, with --work when the port lives elsewhere than build/: without
    it the command looks in build/ and finds no port."""
    where = "" if work_root == DEFAULT_WORK_ROOT.absolute() else f" --work {shlex.quote(str(work_root))}"
    return invocation.command(f"port {words}{where}")


def _find_work(work_root: Path, to: str | None) -> Path:
    found = sorted(path.parent for path in work_root.glob(f"port-*-to-{to or '*'}/{STATE}"))
    if len(found) > 1:  # ports already written are history: the open one is meant
        found = [path for path in found if _load(path).status != "written"] or found
    if not found:
        raise UserError(f"no port in progress (no {work_root}/port-*-to-{to or '*'}/{STATE}); start one with "
                        f"`{port_command(work_root, '--to VERSION')}`")
    if len(found) > 1:
        raise UserError(f"{len(found)} ports in {work_root} ({', '.join(path.name for path in found)}); pick one "
                        "with --to VERSION")
    return found[0]


def _version_in(text: str) -> str | None:
    """The release a package's _version.py declares: the same for both flavours' wheels."""
    version = package_version(text)
    return release_of(version) if version else None
