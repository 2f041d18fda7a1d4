"""One patch read from a foreign source, and the rigstack header it becomes."""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from email.parser import HeaderParser

from rigstack.stack import FIELDS, UNFILLED

_SLUG_WORDS = 6
_SLUG_CHARS = 40


@dataclass(frozen=True)
class Incoming:
    label: str  # where it came from, as errors and the table name it
    subject: str
    diff: str  # the diff as the source holds it
    why: str = ""
    origin: str = ""
    upstream: str = ""
    trailers: tuple[str, ...] = ()  # "Signed-off-by: A <a@b>" lines, in order
    header: str | None = None  # a whole rigstack header carried verbatim (an mbox from `export --format mbox`)
    slug: str | None = None  # the slug its rigstack file had, when known
    strip: int = 1  # leading path components to strip (git's and quilt's -p)
    layout: str | None = None  # "fork" (vllm/ at the top) or "package" when the source knows; else guessed
    left_out: tuple[str, ...] = ()  # paths --include/--exclude took out of the diff
    where: str = ""  # the repository (and commit) the source came from, when it says or its checkout does

    def header_text(self, note: str = "") -> str:
        """The header block of the rigstack patch, every field the source could not fill marked for a person; what
        the import did to the patch (files left out, index ids ignored) is said in Origin, with `note`."""
        notes = "; ".join(filter(None, (f"import left out {', '.join(self.left_out)} (--include/--exclude)"
                                        if self.left_out else "", note)))
        if self.header is not None:
            header = re.sub(r"^(Origin: .*)$", lambda line: f"{line.group(1)}; {notes}", self.header, count=1,
                            flags=re.M) if notes else self.header
            return f"Subject: {self.subject}\n{header}"
        unknown = f"{UNFILLED} from {self.label})"
        origin = "; ".join(filter(None, (self.origin or self.label, self.where, notes)))
        fields = {"subject": self.subject, "why": self.why, "origin": origin,
                  "upstream": self.upstream, "switch": "", "rigs": "", "tests": ""}
        lines = [_field(name, value or unknown) for name, value in fields.items()]
        if self.trailers:
            lines.append(_field("trailers", "\n".join(self.trailers)))
        return "".join(lines)

    @property
    def file_slug(self) -> str:
        return self.slug or slug_of(self.subject)


def _field(name: str, value: str) -> str:
    """Key: value, a multi-line value continued on indented lines (blank lines dropped: they would end the header)."""
    lines = [line.strip() for line in value.splitlines() if line.strip()]
    return f"{name.capitalize()}: " + "\n  ".join(lines) + "\n"


def slug_of(subject: str, words: int = _SLUG_WORDS, chars: int = _SLUG_CHARS) -> str:
    picked = re.findall(r"[a-z0-9]+", subject.lower())[:words] or ["imported"]
    slug = ""
    for word in picked:
        if slug and len(slug) + len(word) + 1 > chars:
            break
        slug = f"{slug}-{word}" if slug else word[:chars]
    return slug


def distinct_slugs(items: list[Incoming]) -> list[Incoming]:
    """The items with a slug no other item of the run has: a shared slug (subjects that differ past the sixth
    word: .../cuda.py and .../cuda_communicator.py) takes more of its subject's words, and what is still shared
    (the same subject twice) gets -2, -3 from its second occurrence on."""
    slugs = [item.file_slug for item in items]
    shared = {slug for slug in slugs if slugs.count(slug) > 1}
    slugs = [slug_of(item.subject, words=64, chars=80) if slug in shared and item.slug is None else slug
             for item, slug in zip(items, slugs)]
    seen: dict[str, int] = {}
    distinct = []
    for slug in slugs:
        seen[slug] = seen.get(slug, 0) + 1
        distinct.append(slug if seen[slug] == 1 else f"{slug}-{seen[slug]}")
    return [item if item.file_slug == slug else replace(item, slug=slug) for item, slug in zip(items, distinct)]


def rigstack_header(body: str) -> str | None:
    """The body itself when it is a rigstack header without its Subject (what `export --format mbox` writes)."""
    text = body.strip("\n")
    first = re.match(r"([A-Za-z-]+): ", text)
    if not first or first.group(1).lower() not in FIELDS:
        return None
    message = HeaderParser().parsestr(text + "\n")
    keys = {key.lower() for key in message.keys()}
    if message.defects or message.get_payload().strip() or "why" not in keys or not keys <= set(FIELDS) - {"subject"}:
        return None
    return text + "\n"


def split_trailers(body: str, trailers: list[str]) -> str:
    """The body without its trailer lines (git found them in the last paragraph)."""
    paragraphs = body.strip("\n").split("\n\n")
    if not trailers:
        return "\n\n".join(paragraphs)
    found = {" ".join(line.split()) for line in trailers}
    # git writes each trailer as "Key: value"; compare the paragraph's lines in that form.
    kept = [line for line in paragraphs[-1].splitlines() if " ".join(line.replace(":", ": ", 1).split()) not in found]
    return "\n\n".join(paragraphs[:-1] + (["\n".join(kept)] if kept else []))
