"""Quilt folders (a series file naming the patches in order) and plain diff files, with DEP-3 headers read."""

from __future__ import annotations

import os
import re
from dataclasses import replace
from email.parser import HeaderParser
from pathlib import Path

from rigstack.errors import UserError
from rigstack.gitrepo import PackageRepo, file_origin
from rigstack.importer.diffs import DIFF_START
from rigstack.importer.incoming import Incoming
from rigstack.importer.mbox import read_mbox
from rigstack.files import read_regular

SERIES = "series"
_STRIP = re.compile(r"^-p(\d+)$")
# DEP-3 (https://dep-team.pages.debian.net/deps/dep3/) fields and what becomes of them; any other field is kept as a
# trailer, so nothing in a header is dropped.
_DESCRIPTION = ("description", "subject")
_AUTHOR = ("author", "from")
_HEADER_LINE = re.compile(r"^[A-Za-z][A-Za-z0-9-]*:( |$)")
# git mailinfo -b's rule, for a mail whose From line was cut off: a [PATCH ...] prefix is no part of the subject.
_PATCH_PREFIX = re.compile(r"^\[[^\]]*\bPATCH\b[^\]]*\]\s*", re.I)
# Far above any real series (51 patches of three outside repositories are under 2 MiB), far below the memory.
MAX_SOURCE_BYTES = 64 << 20
_FIX = "a SOURCE is a patch file, an mbox, a quilt folder or git:PATH@A..B"


def read_text(path: Path, what: str = "import source") -> str:
    """A source file's text: a regular file, bounded, UTF-8, every byte kept (a CRLF file's CRs are content)."""
    data = read_regular(path, what, MAX_SOURCE_BYTES, _FIX)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise UserError(f"{path}: not UTF-8 text; binary patches are not supported") from None


def read_quilt(folder: Path, git: PackageRepo, work: Path) -> list[Incoming]:
    """The patches a quilt series names, in its order; '#' comments and -pN levels are honoured."""
    series = folder / SERIES
    if not os.path.lexists(series):  # whatever is there, read_text says why it is no series file
        raise UserError(f"{folder} has no {SERIES} file; a quilt folder lists its patches in {SERIES} (or pass the "
                        "patch files themselves)")
    items: list[Incoming] = []
    for number, line in enumerate(read_text(series, "quilt series").splitlines(), start=1):
        words = line.split("#", 1)[0].split() if not line.lstrip().startswith("#") else []
        if not words:
            continue
        name, options = words[0], words[1:]
        strip = 1
        for option in options:
            match = _STRIP.match(option)
            if not match:
                raise UserError(f"{series} line {number}: option {option!r} is not supported (only -pN); "
                                "apply a reversed patch (-R) and export it instead")
            strip = int(match.group(1))
        path = folder / name
        if name.startswith("/") or ".." in Path(name).parts or \
                not Path(os.path.realpath(path)).is_relative_to(os.path.realpath(folder)):
            raise UserError(f"{series} line {number} names {name}, which is outside {folder}; a series names the "
                            "patches in its own folder")
        if not os.path.lexists(path):
            raise UserError(f"{series} line {number} names {name}, which is not in {folder}; fix the series or add "
                            "the file")
        items += read_file(path, git, work, strip, label=f"{folder.name}/{name}")
    if not items:
        raise UserError(f"{series} names no patches")
    return items


def read_file(path: Path, git: PackageRepo, work: Path, strip: int = 1, label: str | None = None) -> list[Incoming]:
    """A format-patch file or mbox (it starts with a 'From ' line), else a diff with an optional DEP-3 or free-text
    header before it."""
    label = label or path.name
    text = read_text(path)
    where = file_origin(path) or ""
    if text.startswith("From "):
        return [replace(item, strip=strip, where=where) for item in read_mbox(path, git, work, label)]
    start = DIFF_START.search(text)
    if start is None:
        raise UserError(f"{path} holds no diff (no 'diff --git' or '---' line); is it a patch?")
    head, diff = text[:start.start()], text[start.start():]
    return [replace(_plain(label, path, head, diff, strip), where=where)]


def _plain(label: str, path: Path, head: str, diff: str, strip: int) -> Incoming:
    block, _, rest = head.strip("\n").partition("\n\n")
    if not _HEADER_LINE.match(block):
        block, rest = "", head.strip("\n")
    message = HeaderParser().parsestr(block + "\n")
    rest = f"{message.get_payload()}\n{rest}"  # lines after a header block that stops early are free text
    fields: dict[str, list[str]] = {}
    names: dict[str, str] = {}  # the spelling the header used, for the trailers it keeps
    for key, value in message.items():
        fields.setdefault(key.lower(), []).append(value)
        names.setdefault(key.lower(), key)
    description = next((lines for key in _DESCRIPTION if (lines := _lines(fields.pop(key, [])))), [])
    free = [line for line in rest.splitlines() if line.strip() and line.strip() != "---"]
    subject = description[0] if description else (free.pop(0).strip() if free else _subject_of(path))
    subject = _PATCH_PREFIX.sub("", subject) or subject
    why = "\n".join(description[1:] + free)
    author = next((value for key in _AUTHOR for value in fields.pop(key, [])), "")
    origin = "; ".join([*fields.pop("origin", [label])] + ([f"author {author}"] if author else []) +
                       [f"last update {date}" for date in fields.pop("last-update", [])])
    upstream = "; ".join(_upstream(fields))
    trailers = tuple(f"{names[key]}: {' '.join(value.split())}" for key, values in fields.items() for value in values)
    return Incoming(label, subject, diff, why=why, origin=origin, upstream=upstream, trailers=trailers, strip=strip)


def _lines(values: list[str]) -> list[str]:
    """A DEP-3 multi-line value: continuation lines, where ' .' stands for an empty line."""
    return [line.strip() for value in values for line in value.splitlines() if line.strip() not in ("", ".")]


def _upstream(fields: dict[str, list[str]]) -> list[str]:
    parts = [f"merged in {value.strip()}" for value in fields.pop("applied-upstream", [])]
    for value in fields.pop("forwarded", []):
        answer = value.strip()
        parts.append({"no": "not submitted", "not-needed": "not submitted (not needed upstream)",
                      "yes": "submitted"}.get(answer.lower(), f"submitted: {answer}"))
    for key in [key for key in fields if key == "bug" or key.startswith("bug-")]:
        parts += [f"{key} {value.strip()}" for value in fields.pop(key)]
    return parts


def _subject_of(path: Path) -> str:
    """A plain diff has no subject: its file name stands in (0003-fix-the-thing.diff -> fix the thing)."""
    return re.sub(r"^\d+[-_]", "", path.stem).replace("-", " ").replace("_", " ") or path.stem
