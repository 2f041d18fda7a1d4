"""A patched package's git history is the record; its stamp is derived from it, checked against it and, when it is
missing, unreadable or edited, rebuilt from it (never trusted)."""

from __future__ import annotations

import re
from dataclasses import dataclass

from rigstack import __version__
from rigstack.baseline import Fingerprint, match_flavour
from rigstack.gitrepo import PackageRepo
from rigstack.stack import Patch, stack_hash
from rigstack.stamp import Stamp, StampedPatch, load_stamp, write_stamp
from rigstack.versions import FLAVOURS, Pins, package_version, release_of

TRAILER = "Rigstack-Patch: "
# The tool version that wrote the stamp, kept in the git dir's config: commits stay the same across tool versions.
TOOL_VERSION_KEY = "rigstack.toolversion"
# A port's baseline says which release it holds: "baseline: vLLM 0.33.0 (wheel:0.33.0)".
_PORTED_BASELINE = re.compile(r"vLLM \S+ \((.+)\)")


@dataclass(frozen=True)
class Checked:
    """A package's stamp as its history has it: the stamp file when it agrees, else one rebuilt from the history."""

    stamp: Stamp
    baseline: str
    head: str
    applied: list[tuple[str, StampedPatch]]
    wrong: str | None  # what the stamp file got wrong (a field, or why it could not be read); None: it agrees


def check(repo: PackageRepo, pins: Pins | None, flavour: str | None = None) -> Checked | None:
    """The package's stamp checked against its history (and the pinned fingerprint, with pins); None without a
    history. `flavour` is the fallback when neither the stamp nor the pins can say."""
    head = repo.rev("HEAD")
    if head is None:
        return None
    baseline = repo.root(head)
    applied = applied_patches(repo, baseline, head)
    stamp, problem = load_stamp(repo.package)
    wrong = problem or disagreement(repo, stamp, baseline, head, applied, pins)  # type: ignore[arg-type]
    if wrong:
        stamp = from_history(repo, baseline, head, applied, pins, stamp.flavour if stamp else flavour)
    assert stamp is not None
    return Checked(stamp, baseline, head, applied, wrong)


def record(repo: PackageRepo, stamp: Stamp) -> None:
    """Write the stamp, and note in the git dir which tool wrote it (a stamp's tool_version is checked against it)."""
    repo.run("config", TOOL_VERSION_KEY, stamp.tool_version)
    write_stamp(repo.package, stamp)


def commit_message(patch: Patch, status: str) -> str:
    # A short first line keeps `git log --oneline` readable; export drops it again.
    return (f"{patch.id}: {patch.header.subject}\n\n{patch.header_text}\n{TRAILER}{patch.file}\n"
            f"Rigstack-Id: {patch.id}\nRigstack-Sha256: {patch.sha256}\nRigstack-Status: {status}\n")


def trailers(message: str) -> dict[str, str]:
    _, _, block = message.rpartition("\n" + TRAILER)
    lines = (TRAILER + block).splitlines() if block else []
    return {key: value for key, _, value in (line.partition(": ") for line in lines)}


def applied_patches(repo: PackageRepo, baseline: str, head: str) -> list[tuple[str, StampedPatch]]:
    """(commit, what it applied) for each patch commit on the package's history, from the commits' trailers."""
    entries = []
    for commit, message in repo.log(baseline, head):
        trailer = trailers(message)
        file = trailer.get("Rigstack-Patch", "")
        entries.append((commit, StampedPatch(id=trailer.get("Rigstack-Id", file[:4]), file=file,
                                             sha256=trailer.get("Rigstack-Sha256", ""),
                                             status=trailer.get("Rigstack-Status", "applied"))))
    return entries


def version_of(repo: PackageRepo, commit: str) -> str:
    return package_version((repo.blob_text(commit, "_version.py") if commit else None) or "") or "unknown"


def baseline_label(repo: PackageRepo, baseline: str) -> str:
    """The source the baseline commit was read from (its message names it)."""
    label = repo.message(baseline).removeprefix("baseline: ").strip()
    ported = _PORTED_BASELINE.fullmatch(label)
    return ported.group(1) if ported else label


def disagreement(repo: PackageRepo, stamp: Stamp, baseline: str, head: str, applied: list[tuple[str, StampedPatch]],
                 pins: Pins | None) -> str | None:
    """The first stamp field the package's git history (or, with pins, the pinned fingerprint) contradicts."""
    patches = tuple(done for _, done in applied)
    expected = {"head_commit": head, "baseline_commit": baseline, "patches": patches,
                "stack_hash": stack_hash(patches), "vllm_version": version_of(repo, baseline),
                "source": baseline_label(repo, baseline)}
    wrote = repo.query("config", "--get", TOOL_VERSION_KEY)
    if wrote:  # packages stamped before the tool recorded itself have nothing to check against
        expected["tool_version"] = wrote.strip()
    wrong = next((name for name, value in expected.items() if getattr(stamp, name) != value), None)
    if wrong is None and pins is not None:
        wrong = _pinned_disagreement(stamp, pins)
    return wrong


def _pinned_disagreement(stamp: Stamp, pins: Pins) -> str | None:
    """A stamp of the pinned release must carry a pinned fingerprint, and the flavour it is pinned for (a port's
    baseline, of another release, has none)."""
    unpinned = stamp.flavour in FLAVOURS and not pins.fingerprint(stamp.flavour)  # nothing pinned yet
    if release_of(stamp.vllm_version) != pins.vllm_version or unpinned:
        return None
    matched = match_flavour(stamp.baseline_fingerprint, pins)
    if matched is None:
        return "baseline_fingerprint"
    return "flavour" if matched != stamp.flavour else None


def from_history(repo: PackageRepo, baseline: str, head: str, applied: list[tuple[str, StampedPatch]],
                 pins: Pins | None, flavour: str | None) -> Stamp:
    """Every field of a stamp read back from git: the baseline's files, its commit message, the patch commits."""
    printer = Fingerprint()
    for path, data in repo.file_blobs(baseline, ".py"):
        printer.add(path, data)
    patches = tuple(done for _, done in applied)
    matched = match_flavour(printer.value, pins) if pins else None
    return Stamp(tool_version=__version__, vllm_version=version_of(repo, baseline),
                 flavour=matched or flavour or "unknown", source=baseline_label(repo, baseline),
                 baseline_fingerprint=printer.value, baseline_commit=baseline, head_commit=head,
                 stack_hash=stack_hash(patches), patches=patches)
