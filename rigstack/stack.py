"""The patch stack: parse patches/ into an ordered, validated, hashed series."""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from email.parser import HeaderParser
from pathlib import Path, PurePosixPath

from rigstack import treeswap
from rigstack.errors import UserError
from rigstack.invocation import command
from rigstack.outcomekinds import VERDICTS
from rigstack.files import MIB, read_regular
from rigstack.patchenv import env_reads, reader_helpers
from rigstack.versions import REPO_ROOT

DEFAULT_PATCHES_DIR = REPO_ROOT / "patches"
PACKAGE = "vllm"
SEPARATOR = "---\n"

_NAME = re.compile(r"^(?P<id>\d{4})-[a-z0-9][a-z0-9.-]*\.patch$")
_REQUIRED = ("subject", "why", "origin", "upstream", "switch", "rigs", "tests")
_OPTIONAL = ("reverts", "trailers", "proof")
FIELDS = _REQUIRED + _OPTIONAL
# What `apply.py import` writes into a field its source could not fill; check warns until a person replaces it.
UNFILLED = "unknown (imported"
_ENV_VAR = re.compile(r"\b([A-Z][A-Z0-9_]*[A-Z0-9])=")
_DIFF_GIT = re.compile(r"^diff --git a/(\S+) b/(\S+)$")
_HUNK = re.compile(r"^@@ -(\d+)(?:,\d+)? \+\d+(?:,\d+)? @@")
_HUNK_COUNTS = re.compile(r"@@ -\d+(?:,(\d+))? \+\d+(?:,(\d+))? @@")
# Extended header lines, matched whole: a mode with trailing blanks is still that mode to git, so it must not
# slip past a looser test.
_MODE_LINE = re.compile(r"(old mode|new mode|deleted file mode|new file mode) (.*)")
_INDEX_LINE = re.compile(r"index [0-9a-f]+\.\.[0-9a-f]+(?: (.*))?")
_SIMILARITY = re.compile(r"(similarity|dissimilarity) index \d+%")
_FILE_MODES = ("100644", "100755")
_SPECIAL_MODES = {"120000": "creates or changes a symlink; symlinks are refused",
                  "160000": "creates or changes a gitlink (a submodule); gitlinks are refused"}
# The stack's largest patch is 31 kB; a 50 MB one took 1.8 GB of RAM in git. Refused before git reads it.
MAX_PATCH_BYTES = 4 * MIB


@dataclass(frozen=True)
class PatchHeader:
    subject: str
    why: str
    origin: str
    upstream: str
    switch: str
    rigs: str
    tests: str
    reverts: str | None = None
    trailers: str | None = None  # Signed-off-by and other commit trailers an imported patch carried
    proof: str | None = None  # the verdict its tests earn in the patch proof (rigstack.patchtests), pinned

    def unfilled(self) -> tuple[str, ...]:
        """The fields still holding import's placeholder."""
        return tuple(name.capitalize() for name in _REQUIRED if getattr(self, name).startswith(UNFILLED))


@dataclass(frozen=True)
class Patch:
    id: str
    file: str
    path: Path
    sha256: str
    header: PatchHeader
    header_text: str
    diff: str
    touched_files: tuple[str, ...]  # relative to the package, e.g. "parser/glm47_moe.py"

    @property
    def hunks(self) -> dict[str, list[Hunk]]:
        return parse_hunks(self.diff)


@dataclass(frozen=True)
class Hunk:
    number: int  # 1-based, per file: how errors and port reports name it
    old_start: int
    lines: tuple[str, ...]  # body lines, each with its ' ', '-' or '+' mark

    def changed_old_lines(self) -> list[int]:
        """Old-side lines the hunk removes, and for an insertion the line it follows."""
        touched, line = [], self.old_start
        for text in self.lines:
            if text.startswith("-"):
                touched.append(line)
                line += 1
            elif text.startswith("+"):
                touched.append(max(line - 1, 1))
            elif text.startswith(" "):
                line += 1
        return touched


def parse_hunks(diff: str) -> dict[str, list[Hunk]]:
    """Package-relative path -> its hunks, in order."""
    files: dict[str, list[Hunk]] = {}
    current: list[Hunk] | None = None
    start, body = 0, None

    def close() -> None:
        if body is not None and current is not None:
            current.append(Hunk(len(current) + 1, start, tuple(body)))

    for line in diff.splitlines():
        match = _DIFF_GIT.match(line)
        header = _HUNK.match(line)
        if match or header:
            close()
            body = None
        if match:
            current = files.setdefault(_package_relative(match.group(2)), [])
        elif header:
            start, body = int(header.group(1)), []
        elif body is not None and line[:1] in (" ", "-", "+"):
            body.append(line)
    close()
    return files


@dataclass(frozen=True)
class Stack:
    patches: tuple[Patch, ...]

    @property
    def stack_hash(self) -> str:
        return stack_hash(self.patches)

    @property
    def ids(self) -> tuple[str, ...]:
        return tuple(patch.id for patch in self.patches)

    def switches(self) -> frozenset[str]:
        """The env vars the stack's patches read (from their Switch headers)."""
        return frozenset(name for patch in self.patches for name in _ENV_VAR.findall(patch.header.switch))

    def env_reads(self) -> frozenset[str]:
        """Every env var the stack's patches read: their Switch headers and what their added code reads, through
        reader helpers any patch of the stack adds."""
        helpers = frozenset().union(*(reader_helpers(patch.diff) for patch in self.patches))
        return self.switches().union(*(env_reads(patch.diff, helpers) for patch in self.patches))

    def unfilled_notes(self) -> list[str]:
        """One warning per imported patch whose header still needs a person."""
        return [f"{patch.file}: {', '.join(fields)} still read 'unknown (imported ...)'; fill them in "
                "(see patches/README.md)" for patch in self.patches if (fields := patch.header.unfilled())]

    def select(self, until: str | None = None, only: tuple[str, ...] = ()) -> tuple[Stack, list[str]]:
        """The sub-stack to apply, and notes for the user about revert pairs it cuts through."""
        notes: list[str] = []
        chosen = list(self.patches)
        known = set(self.ids)
        for wanted in ([until] if until else []) + list(only):
            if wanted not in known and wanted != "0000":
                raise UserError(f"no patch {wanted} in the stack (have {', '.join(self.ids) or 'none'}); "
                                f"pick an id from `{command('check')}`")
        if until:
            chosen = [patch for patch in chosen if patch.id <= until]
        if only:
            chosen = [patch for patch in chosen if patch.id in only]
        ids = {patch.id for patch in chosen}
        reverted_by = {patch.header.reverts: patch.id for patch in self.patches if patch.header.reverts}
        for patch in chosen:
            reverter = reverted_by.get(patch.id)
            if reverter is None or reverter in ids:
                continue
            if only:
                raise UserError(f"patch {patch.id} is reverted by {reverter} later in the stack; applying it on its "
                                f"own is refused: select both or neither (--only {patch.id},{reverter})")
            notes.append(f"stopping between {patch.id} and its revert {reverter}: {patch.id}'s change is live here "
                         "but not in the full stack")
        for patch in chosen:
            if patch.header.reverts and patch.header.reverts not in ids:
                raise UserError(f"patch {patch.id} reverts {patch.header.reverts}, which is not selected; "
                                f"select both or neither")
        return Stack(tuple(chosen)), notes


def stack_hash(patches: tuple[Patch, ...] | list[Patch]) -> str:
    digest = hashlib.sha256()
    for patch in patches:
        digest.update(f"{patch.file}\0{patch.sha256}\n".encode())
    return "sha256:" + digest.hexdigest()


def load_stack(patches_dir: Path = DEFAULT_PATCHES_DIR) -> Stack:
    """Every NNNN-*.patch in the folder, in id order; anything malformed is an error before any work starts."""
    treeswap.recover(patches_dir.parent)  # a port --write killed half way is finished first
    if not patches_dir.is_dir():
        raise UserError(f"patch folder {patches_dir} does not exist; pass --patches DIR")
    patches = []
    seen: dict[str, str] = {}
    # Hidden files are a killed write's temporary (rigstack.atomic), never a patch.
    for path in sorted(p for p in patches_dir.glob("*.patch") if not p.name.startswith(".")):
        match = _NAME.match(path.name)
        if not match:
            raise UserError(f"{path}: patch files are named NNNN-slug.patch (lower-case slug); rename it")
        if match["id"] in seen:
            raise UserError(f"{path}: id {match['id']} is also used by {seen[match['id']]}; give it a new id")
        seen[match["id"]] = path.name
        patches.append(parse_patch(path))
    ids = {patch.id for patch in patches}
    for patch in patches:
        if patch.header.reverts and (patch.header.reverts not in ids or patch.header.reverts >= patch.id):
            raise UserError(f"{patch.path}: Reverts: {patch.header.reverts} must name an earlier patch in the stack")
    return Stack(tuple(patches))


def parse_patch(path: Path) -> Patch:
    data = read_regular(path, "patch", MAX_PATCH_BYTES, "split it into smaller patches")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise UserError(f"{path}: not UTF-8 text; binary patches are not supported") from None
    if "\0" in text:
        # git refuses it in a commit message, and reads a diff holding one as binary, in words that name no patch.
        line = text.count("\n", 0, text.index("\0")) + 1
        raise UserError(f"{path}: line {line} holds a NUL byte; a patch is text: remove it")
    header_text, sep, diff = text.partition("\n" + SEPARATOR)
    if not sep or not diff.startswith("diff --git "):
        raise UserError(f"{path}: expected header lines, a line '---', then a git diff (see patches/README.md)")
    header = _parse_header(path, header_text + "\n")
    touched = _check_diff(path, diff)
    return Patch(id=path.name[:4], file=path.name, path=path, sha256=hashlib.sha256(data).hexdigest(),
                 header=header, header_text=header_text + "\n", diff=diff, touched_files=touched)


def _parse_header(path: Path, text: str) -> PatchHeader:
    message = HeaderParser().parsestr(text)
    if message.defects or message.get_payload().strip():
        raise UserError(f"{path}: malformed header (a field line must read 'Key: value'); see patches/README.md")
    fields: dict[str, str] = {}
    for key, value in message.items():
        name = key.lower()
        if name not in _REQUIRED + _OPTIONAL:
            raise UserError(f"{path}: unknown header field {key!r}; known: "
                            f"{', '.join(k.capitalize() for k in _REQUIRED + _OPTIONAL)}")
        if name in fields:
            raise UserError(f"{path}: header field {key!r} appears twice; keep one")
        # Continuation lines keep their breaks; collapse them to the single-spaced value the field means.
        fields[name] = " ".join(value.split())
    missing = [name.capitalize() for name in _REQUIRED if not fields.get(name)]
    if missing:
        raise UserError(f"{path}: header is missing {', '.join(missing)}; see patches/README.md")
    if fields.get("proof") not in (None, *VERDICTS):
        raise UserError(f"{path}: Proof: {fields['proof']!r} is not a verdict; use one of "
                        f"{', '.join(repr(verdict) for verdict in VERDICTS)}")
    return PatchHeader(**fields)


def _package_relative(diff_path: str) -> str:
    return str(PurePosixPath(diff_path).relative_to(PACKAGE))


@dataclass
class _Section:
    """One `diff --git a/OLD b/NEW` section. git takes the file's name from its ---/+++ and rename lines as well,
    so every name in the section must be the one its first line gives."""

    path: Path
    old: str
    new: str
    moved: bool = False  # rename or copy lines: OLD and NEW may differ

    def agree(self, line: str, number: int, name: str, side: str) -> None:
        expected = self.old if side == "old" else self.new
        if name != expected:
            raise UserError(f"{self.path}: diff line {number} {line[:80]!r} names another file than its section's "
                            f"`diff --git` line ({expected}); git would change that one instead: regenerate the patch "
                            "with `apply.py export`")

    def close(self, number: int) -> None:
        if self.old != self.new and not self.moved:
            raise UserError(f"{self.path}: the `diff --git` section ending at diff line {number} names two files "
                            f"({self.old}, {self.new}) and no rename; regenerate the patch with `apply.py export`")


def _check_diff(path: Path, diff: str) -> tuple[str, ...]:
    """The package-relative files a diff touches; refuses anything that could write outside the package.

    Read the way git apply reads it: each hunk's line counts say where it ends, so any text after a hunk that is not
    another hunk or `diff --git` section (a bare ---/+++ section, say, which git would apply too) is refused."""
    touched: list[str] = []
    section: _Section | None = None  # the `diff --git` section the line is in
    in_header = False  # between 'diff --git' and the first hunk, where the path and mode lines live
    old_left = new_left = 0  # lines the current hunk still has on each side
    lines = diff.split("\n")  # git splits on \n only: a \r stays part of the line it ends
    for number, line in enumerate(lines, start=1):
        if old_left > 0 or new_left > 0:
            mark = line[:1]
            if mark not in (" ", "-", "+", "\\", ""):
                raise UserError(f"{path}: diff line {number} ends a hunk early (its @@ line counts more lines); "
                                "regenerate the patch with `apply.py export`")
            old_left -= mark in (" ", "-", "")  # an empty line is an empty context line to git
            new_left -= mark in (" ", "+", "")
        elif line.startswith("diff --git "):
            if in_header:
                section.close(number - 1)  # type: ignore[union-attr]
            section = _open_section(path, line, number)
            touched.append(_package_relative(section.new))
            in_header = True
        elif section and line.startswith("@@ "):
            counts = _HUNK_COUNTS.match(line)
            if not counts:
                raise UserError(f"{path}: unreadable hunk line {number} {line[:60]!r}; regenerate the patch")
            old_left, new_left = (int(count) if count is not None else 1 for count in counts.groups())
            section.close(number)
            in_header = False
        elif in_header and not (not line and number == len(lines)):  # a section may end the text (a pure rename)
            _check_header_line(section, line, number)  # type: ignore[arg-type]
        elif line.startswith("\\") or (not line and number == len(lines)):
            continue  # "\ No newline at end of file", or the end of the text
        else:
            raise UserError(f"{path}: diff line {number} {line[:60]!r} is outside any `diff --git` section (git "
                            "would read a ---/+++ pair there as one more file); regenerate the patch with "
                            "`apply.py export`")
    if in_header:
        section.close(len(lines))  # type: ignore[union-attr]
    if not touched:
        raise UserError(f"{path}: the diff touches no file")
    return tuple(dict.fromkeys(touched))


def _open_section(path: Path, line: str, number: int) -> _Section:
    match = _DIFF_GIT.match(line)
    if not match:
        raise UserError(f"{path}: unreadable diff line {line!r}; regenerate the patch with `apply.py export`")
    for name in match.groups():
        _check_path(path, name, number)
    return _Section(path, *match.groups())


def _check_header_line(section: _Section, line: str, number: int) -> None:
    """One extended header line of a `diff --git` section, parsed strictly: only regular files, only known lines,
    only the section's own names."""
    path = section.path
    mode = _MODE_LINE.fullmatch(line)
    index = _INDEX_LINE.fullmatch(line)
    if mode or (index and index.group(1) is not None):
        value = mode.group(2) if mode else index.group(1)  # type: ignore[union-attr]
        if value not in _FILE_MODES:
            why = _SPECIAL_MODES.get(value.strip(), f"has mode {value!r}; only regular files (100644, 100755) may be "
                                                     "patched")
            raise UserError(f"{path}: diff line {number} {why}")
    elif line.startswith(("--- ", "+++ ")):
        name = line[4:].split("\t")[0]
        side, prefix = ("old", "a/") if line.startswith("-") else ("new", "b/")
        if name != "/dev/null":
            section.agree(line, number, name.removeprefix(prefix) if name.startswith(prefix) else name, side)
    elif line.startswith(("rename from ", "rename to ", "copy from ", "copy to ")):
        words = line.split(" ", 2)
        section.agree(line, number, words[2], "old" if words[1] == "from" else "new")
        section.moved = True
    elif line.startswith(("GIT binary patch", "Binary files ")):
        raise UserError(f"{path}: diff line {number} is a binary patch; binary patches are refused")
    elif not (index or _SIMILARITY.fullmatch(line)):
        raise UserError(f"{path}: diff line {number} {line[:60]!r} is not a git diff header line; regenerate the "
                        "patch with `apply.py export`")


def _check_path(path: Path, name: str, number: int) -> None:
    pure = PurePosixPath(name)
    if pure.is_absolute() or ".." in pure.parts or not pure.parts or pure.parts[0] != PACKAGE or len(pure.parts) < 2:
        raise UserError(f"{path}: diff line {number} touches {name!r}, outside the {PACKAGE}/ package; "
                        f"patches may only change files under {PACKAGE}/")
