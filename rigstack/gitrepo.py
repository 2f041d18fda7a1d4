"""The only module that runs git: a package's history lives in a git dir beside it, the package is the work tree."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
import urllib.parse
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import git

from rigstack.atomic import temp_glob
from rigstack.errors import UserError
from rigstack.stamp import STAMP_NAME

BRANCH = "refs/heads/rigstack"
# Fixed identity and dates make every commit content-addressed: the same baseline and stack give the same ids
# on every machine, so a stamp's commit ids mean something across hosts.
_IDENTITY = {
    "GIT_AUTHOR_NAME": "rigstack", "GIT_AUTHOR_EMAIL": "rigstack@localhost", "GIT_AUTHOR_DATE": "1700000000 +0000",
    "GIT_COMMITTER_NAME": "rigstack", "GIT_COMMITTER_EMAIL": "rigstack@localhost",
    "GIT_COMMITTER_DATE": "1700000000 +0000",
}
# Compiled objects are never patched and make up most of the package's bytes; leaving them untracked keeps the
# baseline commit fast. Patches may not touch them (they are binary), so nothing the stack changes escapes git.
UNTRACKED = ("*.so", "*.pyc", "__pycache__/", f"/{STAMP_NAME}", f"/{temp_glob(Path(STAMP_NAME))}")
# One diff dialect for writing and re-reading patches, whatever the user's git config says.
DIFF_OPTIONS = ("--full-index", "--no-renames", "--no-color", "--no-ext-diff", "--no-textconv", "-U3",
                "--diff-algorithm=myers", "--src-prefix=a/vllm/", "--dst-prefix=b/vllm/")
PATCH_STRIP = "-p2"  # a/vllm/x.py -> x.py: the work tree is the package itself


def state_dir_for(package: Path) -> Path:
    """Where rigstack keeps a package's git dir, combined diff and journal: beside the package, never inside."""
    return package.parent / f"{package.name}.rigstack"


class _LiteralGit(git.Git):
    """GitPython's command runner in a folder named as given: git.Git expands `$VAR` and `~` in its folder (and has
    no switch to stop it), so a checkout under a path holding a `$` ran git somewhere else."""

    def __init__(self, working_dir: Path | None) -> None:
        super().__init__(None)
        self._working_dir = None if working_dir is None else str(working_dir)


class _LiteralRepo(git.Repo):
    GitCommandWrapperType = _LiteralGit


def checkout_repo(path: Path, search_parent_directories: bool = False) -> git.Repo:
    """A git checkout (rigstack's own, a fork's) as GitPython reads it, its path taken literally."""
    return _LiteralRepo(path, search_parent_directories=search_parent_directories, expand_vars=False)


@dataclass(frozen=True)
class ApplyOutcome:
    ok: bool
    output: str


@dataclass(frozen=True)
class MergeOutcome:
    tree: str  # the merged tree; conflicted files hold diff3-style markers
    conflicted: tuple[str, ...]  # package-relative paths git could not merge
    messages: tuple[str, ...]  # git's own lines ("CONFLICT (content): Merge conflict in ...")


class PackageRepo:
    """git with GIT_DIR beside the package and the package as the work tree."""

    def __init__(self, package: Path, git_dir: Path | None = None, object_dir: Path | None = None) -> None:
        self.package = package
        self.git_dir = git_dir or state_dir_for(package) / "git"
        self._env = {"GIT_DIR": str(self.git_dir), "GIT_WORK_TREE": str(package), **_IDENTITY,
                     "GIT_CONFIG_NOSYSTEM": "1", "GIT_CONFIG_GLOBAL": os.devnull}
        if object_dir is not None:
            # Dry runs write new objects to a scratch store and only read the real one.
            self._env["GIT_OBJECT_DIRECTORY"] = str(object_dir)
            self._env["GIT_ALTERNATE_OBJECT_DIRECTORIES"] = str(self.git_dir / "objects")
        self._git = _LiteralGit(package if package.is_dir() else None)

    @property
    def exists(self) -> bool:
        return (self.git_dir / "HEAD").is_file()

    def run(self, *args: str, env: dict[str, str] | None = None, stdin: bytes | None = None) -> str:
        """git's output; a failure is a UserError carrying git's own message (disk full, permissions, a bad ref)."""
        try:
            return self._execute(args, env, stdin)
        except git.GitCommandError as error:
            raise self._failure(args[0], _text(error.stderr)) from None

    def query(self, *args: str) -> str | None:
        """git's output, or None when git says no (a missing ref or file): for questions, not for work."""
        try:
            return self._execute(args, None, None)
        except git.GitCommandError:
            return None

    def _execute(self, args: tuple[str, ...], env: dict[str, str] | None, stdin: bytes | None) -> str:
        return self._git.execute(["git", *args], env={**self._env, **(env or {})}, strip_newline_in_stdout=False,
                                 istream=None if stdin is None else _bytes_stream(stdin))

    def init(self) -> None:
        self.git_dir.mkdir(parents=True, exist_ok=True)
        # Not git.Repo.init: it expands `$VAR` in the path (and expands again, whatever its expand_vars says).
        _LiteralGit(None).execute(["git", "init", "--bare", "-q", str(self.git_dir)],
                                  env={"GIT_CONFIG_NOSYSTEM": "1", "GIT_CONFIG_GLOBAL": os.devnull})
        self.run("config", "core.bare", "false")
        self.run("config", "core.autocrlf", "false")
        self.run("config", "gc.auto", "0")
        (self.git_dir / "info").mkdir(exist_ok=True)
        (self.git_dir / "info" / "exclude").write_text("\n".join(UNTRACKED) + "\n")

    def exclude(self, paths: list[str]) -> None:
        """Keep the baseline's binaries out of `git status` without tracking them."""
        with (self.git_dir / "info" / "exclude").open("a") as handle:
            handle.writelines(f"/{path}\n" for path in paths)

    @contextmanager
    def fast_import(self) -> Iterator[_FastImport]:
        """A git fast-import process: one pack for the whole baseline instead of thousands of loose objects.

        Neither compressed nor deltified: the pack is larger (103 MB against 65 MB for the GPU wheel) but written in
        half the time, and it lives only beside one work folder."""
        command = ["git", "-c", "pack.compression=0", "fast-import", "--quiet", "--done", "--depth=0"]
        process = self._git.execute(command, env=self._env, as_process=True, istream=subprocess.PIPE)
        stream = _FastImport(process.proc.stdin)
        try:
            yield stream
            stream.write(b"done\n")
            process.proc.stdin.close()
        except BrokenPipeError:
            # git stopped reading: its own stderr says why (a full disk, most often).
            process.proc.wait()
            raise self._failure("fast-import", process.proc.stderr.read().decode(errors="replace")) from None
        except BaseException:
            # The producer failed (a bad wheel, no network, Ctrl-C): its error is the one to report, not git's
            # "stream ends early".
            process.proc.kill()
            process.proc.wait()
            raise
        stderr = process.proc.stderr.read().decode(errors="replace")
        if process.proc.wait() != 0:
            raise self._failure("fast-import", stderr)

    def _failure(self, command: str, stderr: str) -> UserError:
        lines = [line.strip() for line in stderr.splitlines() if line.strip()]
        if any(sign in line for line in lines for sign in ("No space left on device", "Out of diskspace")):
            return UserError(f"no space left on the device of {self.git_dir} (git {command}); free some space and "
                             "rerun: the next run finishes or undoes this one")
        first = next((line for line in lines if "error" in line or "fatal" in line), lines[0] if lines else "")
        return UserError(f"git {command} failed in {self.package}: {first[:300] or 'no message'}")

    def rev(self, ref: str) -> str | None:
        found = self.query("rev-parse", "--verify", "--quiet", ref + "^{commit}")
        return found.strip() if found is not None else None

    def tree_of(self, commit: str) -> str:
        return self.run("rev-parse", commit + "^{tree}").strip()

    def commit_tree(self, tree: str, parent: str | None, message: str) -> str:
        args = ["commit-tree", tree] + (["-p", parent] if parent else []) + ["-F", "-"]
        return self.run(*args, stdin=message.encode()).strip()

    def set_branch(self, commit: str) -> None:
        self.run("update-ref", BRANCH, commit)
        self.run("symbolic-ref", "HEAD", BRANCH)

    def apply_to_index(self, patch_file: Path, index_file: Path, *extra: str) -> ApplyOutcome:
        """git apply against an index file only: checks and records a patch without touching the work tree."""
        try:
            output = self._git.execute(["git", "apply", "--cached", "-v", PATCH_STRIP, *extra, str(patch_file)],
                                       env={**self._env, "GIT_INDEX_FILE": str(index_file)},
                                       with_extended_output=True)
            return ApplyOutcome(True, output[2])
        except git.GitCommandError as error:
            return ApplyOutcome(False, _text(error.stderr))

    def read_tree_into(self, index_file: Path, tree: str) -> None:
        self.run("read-tree", tree, env={"GIT_INDEX_FILE": str(index_file)})

    def write_tree(self, index_file: Path) -> str:
        return self.run("write-tree", env={"GIT_INDEX_FILE": str(index_file)}).strip()

    def dirty_files(self) -> list[str]:
        """Tracked files whose content differs from HEAD, and untracked files the user added."""
        out = self.run("status", "--porcelain=v1", "-z", "--untracked-files=all")
        return [entry[3:] for entry in out.split("\0") if entry]

    def ignored_files(self) -> list[str]:
        """Files in the package git leaves untracked by its exclude rules (compiled objects, bytecode, the stamp)."""
        out = self.run("ls-files", "-z", "--others", "--ignored", "--exclude-standard")
        return [name for name in out.split("\0") if name]

    def modified_files(self) -> list[str]:
        """Tracked files whose content in the work tree differs from the index (deleted ones too)."""
        self.run("update-index", "-q", "--refresh")  # stat-only changes are no change
        return [name for name in self.run("diff-files", "--name-only", "-z").split("\0") if name]

    def changed_blobs(self, old: str, new: str) -> dict[str, tuple[str | None, str | None]]:
        """path -> (its blob at old, its blob at new), None where a commit has no such file, for each path that
        differs between the two."""
        fields = self.run("diff-tree", "-r", "-z", "--no-renames", old, new).split("\0")
        ends: dict[str, tuple[str | None, str | None]] = {}
        for status, path in zip(fields[0::2], fields[1::2]):
            if status:
                _, _, before, after, _ = status.split()
                ends[path] = (None if set(before) == {"0"} else before, None if set(after) == {"0"} else after)
        return ends

    def work_blobs(self, paths: list[str]) -> dict[str, str]:
        """path -> the blob id git would give each of those work-tree files (read as they are, no filters)."""
        if not paths:
            return {}
        names = "".join(f"{self.package / path}\n" for path in paths).encode()
        ids = self.run("hash-object", "--no-filters", "--stdin-paths", stdin=names).split()
        return dict(zip(paths, ids))

    def blob_bytes(self, blob: str) -> bytes:
        return self._git.execute(["git", "cat-file", "blob", blob], env=self._env, stdout_as_string=False,
                                 strip_newline_in_stdout=False)

    def checkout(self, old: str, new: str) -> None:
        """Move the work tree from commit old to commit new, writing only the files that differ."""
        self.run("read-tree", "-m", "-u", old, new)
        self.run("update-ref", BRANCH, new)
        self.run("update-index", "-q", "--refresh")  # -q: a file that "needs update" is no failure

    def reset_hard(self, commit: str) -> None:
        self.run("reset", "-q", "--hard", commit)
        self.run("update-ref", BRANCH, commit)

    def diff(self, old: str, new: str, renames: bool = False) -> str:
        """The stack's diff of two commits (see patches/README.md). With `renames`, a moved file stays a rename (git
        -M); git names its rename lines from the package root, and the stack roots every path at vllm/."""
        if not renames:
            return self.run("diff", *DIFF_OPTIONS, old, new)
        text = self.run("diff", *("-M" if option == "--no-renames" else option for option in DIFF_OPTIONS), old, new)
        return re.sub(r"^(rename|copy) (from|to) ", r"\1 \2 vllm/", text, flags=re.M)

    def changed_files(self, old: str, new: str) -> list[str]:
        out = self.run("diff", "--name-only", "--no-renames", "-z", "--diff-filter=AM", old, new)
        return [name for name in out.split("\0") if name]

    def log(self, old: str, new: str) -> list[tuple[str, str]]:
        """(commit, full message) from old (exclusive) to new, oldest first."""
        out = self.run("log", "--reverse", "--format=%H%x00%B%x01", f"{old}..{new}")
        entries = [chunk.strip("\n") for chunk in out.split("\x01") if chunk.strip("\n")]
        return [tuple(entry.split("\0", 1)) for entry in entries]  # type: ignore[misc]

    def root(self, commit: str) -> str:
        """The first commit of the history that leads to `commit` (the baseline)."""
        return self.run("rev-list", "--max-parents=0", commit).split()[-1]

    def blob_sizes(self, commit: str, paths: list[str]) -> int:
        """Total bytes of those files at `commit`: what a checkout of them writes."""
        if not paths:
            return 0
        out = self.run("ls-tree", "-l", "-z", commit, "--", *paths)
        return sum(int(size) for entry in out.split("\0") if entry
                   for size in [entry.split(None, 4)[3]] if size.isdigit())

    def file_blobs(self, commit: str, suffix: str) -> Iterator[tuple[str, bytes]]:
        """(path, content) of every file at `commit` whose name ends with `suffix`, read in one cat-file process."""
        listing = self.run("ls-tree", "-r", "-z", "--full-tree", commit)
        entries = [(line.split("\t", 1)[1], line.split()[2]) for line in listing.split("\0") if line]
        return self._cat_blobs([(path, blob) for path, blob in entries if path.endswith(suffix)])

    def blobs_at(self, commit: str, paths: list[str]) -> Iterator[tuple[str, bytes]]:
        """(path, content) of each of `paths` at `commit`, in order, read in one cat-file process (a git process
        per file costs milliseconds each, and an apply checks every file the stack changes)."""
        return self._cat_blobs([(path, f"{commit}:{path}") for path in paths])

    def _cat_blobs(self, wanted: list[tuple[str, str]]) -> Iterator[tuple[str, bytes]]:
        if not wanted:
            return
        data = self._git.execute(["git", "cat-file", "--batch"], env=self._env, strip_newline_in_stdout=False,
                                 istream=_bytes_stream("".join(f"{name}\n" for _, name in wanted).encode()),
                                 as_process=False, stdout_as_string=False)
        offset = 0
        for path, _ in wanted:
            header_end = data.index(b"\n", offset)
            size = int(data[offset:header_end].split()[2])
            yield path, data[header_end + 1: header_end + 1 + size]
            offset = header_end + 2 + size

    def remove_stale_locks(self) -> list[str]:
        """Delete the lock files a killed git left (index.lock, a ref's .lock); only safe while no git runs here."""
        if not self.git_dir.is_dir():
            return []
        stale = [path for path in self.git_dir.rglob("*.lock") if "objects" not in path.relative_to(self.git_dir).parts]
        for path in stale:
            path.unlink()
        return [str(path.relative_to(self.git_dir)) for path in stale]

    def message(self, commit: str) -> str:
        return self.run("log", "-1", "--format=%B", commit)

    # --- porting (rigstack/port.py): two baselines and two lines of patch commits in one history ---

    def import_commit(self, files: Iterator[tuple[str, int, bytes]], message: str, ref: str) -> str:
        """fast-import one root commit holding `files` and point `ref` at it (BRANCH is only the import's name)."""
        self.run("update-ref", "-d", BRANCH)  # fast-import will not move an existing branch to an unrelated commit
        with self.fast_import() as stream:
            stream.commit(files, message)
        commit = self.rev(BRANCH)
        assert commit is not None
        self.run("update-ref", ref, commit)
        self.run("update-ref", "-d", BRANCH)
        return commit

    def cherry_merge(self, base: str, ours_tree: str, theirs: str, labels: tuple[str, str]) -> MergeOutcome:
        """A cherry-pick done in the object store: 3-way merge of `theirs` onto `ours_tree` with `base` as the merge
        base (git 2.39's merge-tree has no --merge-base, so a commit of ours_tree on top of base makes base the only
        common ancestor). Rename detection follows files that moved on either side; the work tree is not touched."""
        ours = self.commit_tree(ours_tree, base, "port: merge side\n")
        refs = [f"refs/heads/{label}" for label in labels]  # conflict markers are labelled with these names
        for ref, commit in zip(refs, (ours, theirs)):
            self.run("update-ref", ref, commit)
        try:
            status, out, err = self._git.execute(
                ["git", "-c", "merge.conflictStyle=diff3", "-c", "merge.renames=true", "merge-tree", "--write-tree",
                 *labels], env=self._env, with_extended_output=True, with_exceptions=False,
                strip_newline_in_stdout=False)
        finally:
            for ref in refs:
                self.run("update-ref", "-d", ref)
        if status not in (0, 1):
            raise UserError(f"git merge-tree failed in {self.git_dir}: {_text(err)[:300]}")
        lines = out.splitlines()
        conflicted: list[str] = []
        rest = lines[1:]
        while rest and rest[0]:
            conflicted.append(rest.pop(0).split("\t", 1)[1])
        messages = tuple(line for line in rest if line)
        return MergeOutcome(lines[0].strip(), tuple(dict.fromkeys(conflicted)), messages)

    def blob_text(self, treeish: str, path: str) -> str | None:
        """A file's text at a commit or tree, or None when it has no such file."""
        return self.query("cat-file", "blob", f"{treeish}:{path}")

    def lay_tree(self, tree: str) -> None:
        """Make the index and the work tree hold `tree`, discarding edits (only files that differ are written)."""
        self.run("read-tree", "-u", "--reset", tree)

    def stage_work_tree(self) -> str:
        """The tree of the work tree as it is now (the user's edits included)."""
        self.run("add", "-A")
        return self.run("write-tree").strip()

    def packs(self) -> set[Path]:
        return set((self.git_dir / "objects" / "pack").glob("pack-*.pack"))

    def link_packs(self, packs: list[Path]) -> None:
        """Share another store's packs by hard link: packs never change, and a link outlives the store it came from."""
        target = self.git_dir / "objects" / "pack"
        target.mkdir(parents=True, exist_ok=True)
        for pack in packs:
            for source in (pack, pack.with_suffix(".idx")):  # the index last: git ignores a pack until it has one
                destination = target / source.name
                if destination.exists():
                    continue
                try:
                    os.link(source, destination)
                except OSError:  # another file system
                    shutil.copy2(source, destination)

    def applies_to(self, tree: str, patch_file: Path, *extra: str) -> ApplyOutcome:
        """Would a patch apply to `tree`? Checked against a scratch index; nothing is written."""
        with tempfile.TemporaryDirectory(prefix="rigstack-index-") as tmp:
            index = Path(tmp) / "index"
            self.read_tree_into(index, tree)
            return self.apply_to_index(patch_file, index, "--check", *extra)


def checkout_revision(root: Path) -> tuple[str, str]:
    """A git checkout's origin URL and commit (with -dirty when it has changes), for provenance labels."""
    try:
        repo = checkout_repo(root)
        source = next((redact_url(remote.url) for remote in repo.remotes if remote.name == "origin"),
                      f"file://{root}")
        revision = repo.head.commit.hexsha + ("-dirty" if repo.is_dirty() else "")
    except (git.InvalidGitRepositoryError, git.NoSuchPathError, ValueError):
        return f"file://{root}", "unknown"
    return source, revision


def file_origin(path: Path) -> str | None:
    """Where a file came from when it is committed in a git checkout: "REL in URL at commit SHA" (the origin
    remote's URL without credentials, else the checkout's path), for an imported patch's Origin; None otherwise."""
    try:
        repo = checkout_repo(path.parent, search_parent_directories=True)
        root = Path(repo.working_tree_dir or "")
        rel = path.absolute().relative_to(root.absolute()).as_posix()
        if not repo.git.ls_files("--error-unmatch", "--", rel):
            return None
        source, revision = checkout_revision(root)
    except (git.InvalidGitRepositoryError, git.NoSuchPathError, git.GitCommandError, ValueError):
        return None
    return f"{rel} in {source} at commit {revision}"


# user:secret@ wherever it stands (git takes forms no URL parser reads, as https:user:TOKEN@host/x or
# host/user:TOKEN@x): from the start or a / up to the @.
_USER_SECRET = re.compile(r"(^|/)[^/@:\s]*:[^/@\s]*@")


def redact_url(url: str) -> str:
    """A remote URL without its credentials (https://TOKEN@host/x, https://user:pw@host/x, TOKEN@host:x, and any
    other user:secret@ shape), which must not end up in labels or results."""
    parts = urllib.parse.urlsplit(url)
    if parts.scheme and parts.netloc:
        host = parts.netloc.rpartition("@")[2]
        url = urllib.parse.urlunsplit(parts._replace(netloc=host, query="", fragment=""))
    else:
        user, at, rest = url.partition("@")  # scp-like user@host:path
        url = rest if at and ":" in rest and "/" not in user else url
    return _USER_SECRET.sub(r"\1", url)


class _FastImport:
    def __init__(self, pipe) -> None:  # noqa: ANN001 - a subprocess pipe
        self._pipe = pipe
        self.write = pipe.write

    def commit(self, files: Iterator[tuple[str, int, bytes]], message: str) -> None:
        """One commit on BRANCH holding every file given, inline."""
        encoded = message.encode()
        when = _IDENTITY["GIT_COMMITTER_DATE"]
        self.write(f"commit {BRANCH}\nmark :1\nauthor rigstack <rigstack@localhost> {when}\n"
                   f"committer rigstack <rigstack@localhost> {when}\ndata {len(encoded)}\n".encode() + encoded + b"\n")
        for path, mode, data in files:
            self.write(f"M {mode:o} inline {path}\ndata {len(data)}\n".encode())
            self.write(data)
            self.write(b"\n")
        self.write(b"\n")


def _bytes_stream(data: bytes):  # noqa: ANN202 - a real file object, as GitPython's istream wants
    handle = tempfile.TemporaryFile()
    handle.write(data)
    handle.seek(0)
    return handle


def _text(value: object) -> str:
    text = value.decode(errors="replace") if isinstance(value, bytes) else str(value or "")
    # GitPython wraps stderr as "  stderr: '...'"; keep git's own words.
    return text.strip().removeprefix("stderr: ").strip("'")
