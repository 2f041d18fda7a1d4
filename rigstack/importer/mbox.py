"""git format-patch files and mboxes: read with git's own mailsplit and mailinfo, and the stack written as one mbox."""

from __future__ import annotations

import re
import tempfile
from email.header import Header
from pathlib import Path

from rigstack import patched
from rigstack.atomic import write_atomic
from rigstack.errors import UserError
from rigstack.gitrepo import PackageRepo
from rigstack.importer.diffs import DIFF_START
from rigstack.importer.incoming import Incoming, rigstack_header, split_trailers
from rigstack.stack import parse_patch

_COMMIT = re.compile(r"^From ([0-9a-f]{40}) ")
_COVER = re.compile(r"^Subject:.*\[[^\]]*\b0+/\d+\]", re.M | re.I)
# The last line of a mail that `export --format mbox` wrote: the patch file it came from.
_FILE_LINE = re.compile(r"^Rigstack-Patch: \d{4}-([a-z0-9][a-z0-9.-]*)\.patch\n*\Z", re.M)
_NO_COMMIT = "0" * 40


def read_mbox(path: Path, git: PackageRepo, work: Path, label: str, layout: str | None = None,
              by_commit: bool = False) -> list[Incoming]:
    """Every patch mail of an mbox (or of one format-patch file); a cover letter is passed over."""
    folder = Path(tempfile.mkdtemp(prefix="mails-", dir=work))
    # -b: a file without a From line is one mail; --keep-cr: a CRLF file's CRs are its content (as `git am --keep-cr`)
    git.run("mailsplit", "-b", "--keep-cr", f"-o{folder}", str(path))
    mails = sorted(folder.iterdir())
    items = []
    for number, mail in enumerate(mails, start=1):
        name = f"{label} message {number}" if len(mails) > 1 and not by_commit else label
        item = _read_mail(mail, git, name, layout, by_commit)
        if item is not None:
            items.append(item)
    if not items:
        raise UserError(f"{label} holds no patch (expected mails from `git format-patch`, each with a diff)")
    return items


def _read_mail(mail: Path, git: PackageRepo, label: str, layout: str | None, by_commit: bool) -> Incoming | None:
    raw = mail.read_bytes()
    text = raw.decode("utf-8", errors="replace")
    if b"\0" in raw.partition(b"\n\n")[0]:  # git mailinfo cuts a header at a NUL, silently
        raise UserError(f"{label}: a NUL byte in its mail headers (the Subject would be cut there); remove it")
    commit = _COMMIT.match(text)
    sha = commit.group(1) if commit and commit.group(1) != _NO_COMMIT else None
    if by_commit and sha:
        label = f"{label}@{sha[:12]}"
    body_file, patch_file = mail.with_suffix(".msg"), mail.with_suffix(".diff")
    info = git.run("mailinfo", "-b", str(body_file), str(patch_file), stdin=raw)
    fields = dict(line.split(": ", 1) for line in info.splitlines() if ": " in line)
    subject = fields.get("Subject", "").strip()
    diff, body = _utf8(patch_file, label), _utf8(body_file, label)
    if not DIFF_START.search(diff):
        if _COVER.search(text.partition("\n\n")[0]):
            return None  # a cover letter: nothing to apply
        raise UserError(f"{label} ({subject or 'no subject'}) holds no diff; remove it from the mbox or add its diff")
    if not subject:
        raise UserError(f"{label} has no Subject; give the mail one (`git format-patch` writes it)")
    carried = _FILE_LINE.search(body)
    if carried and (header := rigstack_header(body[:carried.start()])) is not None:
        return Incoming(label, subject, diff, header=header, slug=carried.group(1), layout=layout)
    trailers = [line for line in git.run("interpret-trailers", "--parse", stdin=body.encode()).splitlines() if line]
    author = f"{fields['Author']} <{fields['Email']}>" if fields.get("Author") else fields.get("Email", "")
    origin = ", ".join(part for part in (label, f"commit {sha}" if sha else "", f"author {author}" if author else "",
                                         f"date {fields['Date']}" if fields.get("Date") else "") if part)
    return Incoming(label, subject, diff, why=split_trailers(body, trailers), origin=origin, trailers=tuple(trailers),
                    layout=layout)


def _utf8(path: Path, label: str) -> str:
    try:
        return path.read_bytes().decode("utf-8")  # bytes: read_text would turn a CRLF file's CRs into newlines
    except UnicodeDecodeError:
        raise UserError(f"{label}: not UTF-8 text after decoding; binary patches are not supported") from None


# --- writing --------------------------------------------------------------------------------------------------------

def export_mbox(package: Path, to: Path) -> Path:
    """The stack of a patched package as one mbox for `git am` (onto a repository with vllm/ at its top; a
    repository of the package itself takes `git am -p2`). Each mail's body is the patch's header, so importing the
    mbox gives the patches back byte for byte; renames stay renames."""
    if to.is_dir():
        raise UserError(f"--to {to} is a folder; an mbox is one file: pass --to FILE")
    commits = {entry["file"]: entry["commit"] for entry in patched.status(package)["patches"]}
    repo = PackageRepo(package.absolute())
    with tempfile.TemporaryDirectory(prefix="rigstack-export-") as tmp:
        # The headers exactly as `export` writes them; only the diffs are made again, keeping renames.
        exported = [parse_patch(path) for path in patched.export(package, Path(tmp))]
    mails = [_mail(number, len(exported), commits[patch.file], patch.header.subject, patch.header_text, patch.file,
                   repo.diff(commits[patch.file] + "^", commits[patch.file], renames=True), repo)
             for number, patch in enumerate(exported, start=1)]
    return write_atomic(to, "".join(mails))


def _mail(number: int, total: int, commit: str, subject: str, header_text: str, file: str, diff: str,
          repo: PackageRepo) -> str:
    author, date = repo.run("log", "-1", "--format=%an <%ae>%n%aD", commit).splitlines()[:2]
    width = len(str(total))
    title = f"[PATCH {number:0{width}}/{total}] {subject}"
    if not title.isascii():
        title = Header(title, "utf-8").encode()
    return (f"From {commit} Mon Sep 17 00:00:00 2001\nFrom: {author}\nDate: {date}\nSubject: {title}\n"
            "MIME-Version: 1.0\nContent-Type: text/plain; charset=UTF-8\nContent-Transfer-Encoding: 8bit\n\n"
            f"{_without_subject(header_text)}Rigstack-Patch: {file}\n---\n{diff}\n")


def _without_subject(header_text: str) -> str:
    """The header block less its Subject field (which becomes the mail's Subject), continuation lines included."""
    kept, skipping = [], False
    for line in header_text.splitlines(keepends=True):
        if line[:1] not in (" ", "\t"):
            skipping = line.lower().startswith("subject:")
        if not skipping:
            kept.append(line)
    return "".join(kept)
