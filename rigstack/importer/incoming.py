"""One patch read from a foreign source, and the rigstack header it becomes."""

from __future__ import annotations

import re
from dataclasses import dataclass
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

    def header_text(self) -> str:
        """The header block of the rigstack patch, every field the source could not fill marked for a person."""
        if self.header is not None:
            return f"Subject: {self.subject}\n{self.header}"
        unknown = f"{UNFILLED} from {self.label})"
        fields = {"subject": self.subject, "why": self.why, "origin": self.origin or self.label,
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


def slug_of(subject: str) -> str:
    words = re.findall(r"[a-z0-9]+", subject.lower())[:_SLUG_WORDS] or ["imported"]
    slug = ""
    for word in words:
        if slug and len(slug) + len(word) + 1 > _SLUG_CHARS:
            break
        slug = f"{slug}-{word}" if slug else word[:_SLUG_CHARS]
    return slug


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
