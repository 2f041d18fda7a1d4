"""Read the files a foreign diff touches (git or traditional unified form), and write the stack's own diff form."""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Sequence
from dataclasses import dataclass, field

from rigstack.errors import UserError

_HUNK = re.compile(r"^@@ -\d+(?:,(\d+))? \+\d+(?:,(\d+))? @@")
_DIFF_GIT = re.compile(r"^diff --git (\S+) (\S+)$")
_INDEX = re.compile(r"^index ([0-9a-fA-F]+)\.\.([0-9a-fA-F]+)(?: (\d+))?$")
_SYMLINK = "120000"
# Where the diff of a format-patch mail, a quilt patch or a plain diff file begins.
DIFF_START = re.compile(r"^(diff --git |--- \S|Index: \S)", re.M)


@dataclass
class FileDiff:
    """One file of a diff; paths are stripped of the diff's -p level but not yet re-rooted."""

    old: str | None = None  # None: a new file
    new: str | None = None  # None: a deleted file
    old_id: str | None = None  # the (maybe abbreviated) blob id of the old side, from the index line
    binary: bool = False
    symlink: bool = False
    rename: bool = False
    names: list[str] = field(default_factory=list)  # the diff --git line's two names, a fallback
    side: str = ""  # "created" or "deleted" when the git header says so
    start: int = 0  # the line (of diff.split("\n")) where this file's section begins

    @property
    def paths(self) -> list[str]:
        return [path for path in dict.fromkeys((self.old, self.new)) if path]


def files_of(diff: str, strip: int, label: str) -> list[FileDiff]:
    """The files a diff touches, read the way `git apply -p<strip>` reads them; hunk bodies are skipped by count,
    so a removed line that reads '-- x' is never taken for a file name. Lines end at "\n" only: a CR (a CRLF file)
    or a form feed inside a line is the file's content, as it is to git."""
    lines = diff.split("\n")
    files: list[FileDiff] = []
    current: FileDiff | None = None
    in_header = False
    index = 0
    while index < len(lines):
        line = lines[index]
        hunk = _HUNK.match(line)
        if line.startswith("diff --git "):
            match = _DIFF_GIT.match(line)
            if not match:
                raise UserError(f"{label}: cannot read {line!r} (quoted or spaced file names are not supported)")
            current = FileDiff(names=[_strip(name, strip, label) for name in match.groups()], start=index)
            in_header = True
            files.append(current)
        elif line.startswith("--- ") and index + 1 < len(lines) and lines[index + 1].startswith("+++ "):
            if current is None or not in_header:
                current = FileDiff(start=index)
                files.append(current)
            current.old = _name(line[4:], strip, label)
            current.new = _name(lines[index + 1][4:], strip, label)
            in_header = False
            index += 1
        elif hunk and current is not None:
            old, new = int(hunk.group(1) or 1), int(hunk.group(2) or 1)
            in_header = False
            while (old > 0 or new > 0) and index + 1 < len(lines):
                index += 1
                mark = lines[index][:1]
                old -= mark in (" ", "-", "")
                new -= mark in (" ", "+", "")
        elif current is not None and in_header:
            _header_line(current, line, strip, label)
        index += 1
    for entry in files:
        if entry.names and not (entry.old or entry.new):
            # A mode change, an empty new file, or a binary file: no ---/+++ lines, only the diff --git names.
            old, new = entry.names
            entry.old = None if entry.side == "created" else old
            entry.new = None if entry.side == "deleted" else new
    return files


@dataclass(frozen=True)
class PathFilter:
    """git apply's --include/--exclude, order-independent: a path is kept when it matches an include pattern (or
    none is given) and no exclude pattern. Patterns are fnmatch globs on the path as the diff names it after -p
    (`*` also crosses `/`, as in git apply)."""

    include: tuple[str, ...] = ()
    exclude: tuple[str, ...] = ()

    def keeps(self, path: str) -> bool:
        def matches(patterns: Sequence[str]) -> bool:
            return any(fnmatch.fnmatchcase(path, pattern) for pattern in patterns)
        return (not self.include or matches(self.include)) and not matches(self.exclude)

    def __bool__(self) -> bool:
        return bool(self.include or self.exclude)


def filtered(diff: str, strip: int, label: str, paths: PathFilter) -> tuple[str, list[str]]:
    """The diff with only the files `paths` keeps (a rename is kept when either name is), and the paths left out."""
    files = files_of(diff, strip, label)
    if not paths or not files:
        return diff, []
    lines = diff.split("\n")
    bounds = [entry.start for entry in files] + [len(lines)]
    kept, dropped = lines[:bounds[0]], []
    for entry, start, end in zip(files, bounds, bounds[1:]):
        if any(paths.keeps(path) for path in entry.paths):
            kept += lines[start:end]
        else:
            dropped += entry.paths
    if len(kept) == bounds[0]:
        return "", dropped
    text = "\n".join(kept)
    return text if text.endswith("\n") else text + "\n", dropped


def _header_line(entry: FileDiff, line: str, strip: int, label: str) -> None:
    if line.startswith(("rename from ", "copy from ")):
        entry.old, entry.rename = _strip(line.split(" ", 2)[2], max(strip - 1, 0), label), True
    elif line.startswith(("rename to ", "copy to ")):
        entry.new, entry.rename = _strip(line.split(" ", 2)[2], max(strip - 1, 0), label), True
    elif match := _INDEX.match(line):
        entry.old_id = match.group(1)
        entry.symlink |= match.group(3) == _SYMLINK
    elif line.startswith(("new file mode ", "deleted file mode ", "new mode ", "old mode ")):
        entry.symlink |= line.endswith(" " + _SYMLINK)
        entry.side = {"new": "created", "deleted": "deleted"}.get(line.split(" ", 1)[0], entry.side)
    elif line.startswith(("GIT binary patch", "Binary files ")):
        entry.binary = True


def _name(text: str, strip: int, label: str) -> str | None:
    name = text.split("\t")[0].rstrip()
    return None if name == "/dev/null" else _strip(name, strip, label)


def _strip(name: str, strip: int, label: str) -> str:
    if name.startswith('"'):
        raise UserError(f"{label}: the file name {name} is quoted (unusual characters); rename the file")
    parts = name.split("/")
    if len(parts) <= strip:
        raise UserError(f"{label}: the file name {name!r} has fewer than {strip} leading folders to strip; "
                        "check the patch's -p level")
    return "/".join(parts[strip:])

