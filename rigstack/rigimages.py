"""Per-rig Docker images: lay only the stack's changed files over the pinned base, verify them, or bind-mount them.

The connection and the package export live in rigstack.dockerapi; the rest of the docker SDK use is here, and
every docker failure a user can fix becomes a UserError.
Library functions return data (BuildResult, VerifyReport); the local base images the tests and the CPU
profiles build on come from rigstack.localbase.
CLI: rigstack/commands/image.py (`rigstack image build|verify|base`, or `python -m rigstack.images ...`).
"""

from __future__ import annotations

import datetime
import errno
import hashlib
import io
import json
import os
import shutil
import stat
import tarfile
import tempfile
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from urllib.parse import urlsplit

import docker
import docker.errors

from rigstack import __version__
from rigstack.atomic import write_atomic
from rigstack.dockerapi import connect, local_image, split_tag
from rigstack.errors import UserError
from rigstack.gitrepo import checkout_revision
from rigstack.invocation import command
from rigstack.stack import DEFAULT_PATCHES_DIR, Stack, load_stack
from rigstack.stamp import STAMP_NAME, Stamp, read_stamp
from rigstack.versions import REPO_ROOT, Pins, load_pins

DOCKERFILE = REPO_ROOT / "images" / "Dockerfile"
RECORDS_DIR = Path("build") / "images"  # beside the patched packages apply.py writes under build/
TOOL_HOME = "/opt/rigstack"
MANIFEST = f"{TOOL_HOME}/manifest.json"
MANIFEST_SCHEMA = 1
OCI = "org.opencontainers.image."
LABEL = "org.rigstack."


@dataclass(frozen=True)
class RigImage:
    """What a profile says about its image: the rig (profile name) and the tag to build."""

    rig: str
    tag: str
    flavour: str = "gpu"  # "cpu": built on the local CPU serving base unless a base is given


@dataclass(frozen=True)
class BuildResult:
    rig: str
    tag: str
    image_id: str
    cache_key: str
    built: bool  # False: an image with the same cache key existed and was reused
    base: str = ""
    laid: int = 0  # files laid over the base's package
    warnings: tuple[str, ...] = ()
    log: tuple[str, ...] = ()  # the builder's output


@dataclass(frozen=True)
class ImageCheck:
    name: str
    ok: bool
    detail: str


@dataclass(frozen=True)
class VerifyReport:
    image: str
    checks: tuple[ImageCheck, ...]

    @property
    def ok(self) -> bool:
        return all(check.ok for check in self.checks)

    @property
    def failures(self) -> tuple[ImageCheck, ...]:
        return tuple(check for check in self.checks if not check.ok)


# --- reading images ------------------------------------------------------------------------------------------------

def _base_fix(ref: str) -> str:
    return (f"pull it with `docker pull {ref}`, or without a registry import one (`docker load -i FILE.tar`; "
            f"`python -m rigstack.images base --standin --tag {ref}` makes a local stand-in for tests, "
            "`base --cpu` a CPU serving base)")


@contextmanager
def _created(client: docker.DockerClient, ref: str) -> Iterator:
    """A container of `ref` that is created but never started: enough to read files out of the image."""
    container = client.containers.create(ref, command=["rigstack-never-started"])
    try:
        yield container
    finally:
        container.remove(force=True)


def _read_file(container, path: str) -> bytes | None:  # noqa: ANN001 - a docker Container
    try:
        chunks, _ = container.get_archive(path)
    except docker.errors.NotFound:
        return None
    with tarfile.open(fileobj=io.BytesIO(b"".join(chunks)), mode="r:") as archive:
        member = archive.next()
        handle = archive.extractfile(member) if member is not None and member.isfile() else None
        return handle.read() if handle else None


# --- what to lay ---------------------------------------------------------------------------------------------------

def guard_laid(paths: Iterable[str], package: Path | None = None) -> list[str]:
    """Refuse anything that would shadow the base's compiled extensions or replace the whole package."""
    checked = []
    for path in paths:
        pure = PurePosixPath(path)
        name = pure.name
        if path in ("", ".", "/") or path.endswith("/") or (package is not None and (package / path).is_dir()):
            raise UserError(f"refusing to lay {path!r}: it is a folder and would replace the image's package "
                            "(and its compiled .so files); lay only changed files")
        if pure.is_absolute() or ".." in pure.parts:
            raise UserError(f"refusing to lay {path!r}: it points outside the package; fix the patch's paths")
        if name.endswith(".so") or ".so." in name:
            raise UserError(f"refusing to lay {path}: it would shadow the base image's compiled extension; "
                            "patches must not change .so files")
        checked.append(pure.as_posix())
    return sorted(set(checked))


def laid_files(package: Path) -> list[str]:
    """The patched package's changed files plus its stamp (from the applier), checked by the .so guard."""
    from rigstack.patched import laid_files as changed

    paths = guard_laid(changed(package), package)
    missing = [path for path in paths if not (package / path).is_file()]
    if missing:
        raise UserError(f"{package}/{missing[0]} is listed as changed but is not a file; rerun "
                        f"`{command(f'apply --from dir:{package}')}`")
    return paths


def bind_mounts(package: Path, container_package: str | None = None) -> list[str]:
    """`docker run` arguments that mount only the stack's changed files (and the stamp) of a patched host package
    over the image's package, read-only: ["-v", "HOST:CONTAINER:ro", ...]. The alternative to a built image
    (seed 002's way), with the same guard: never a whole `vllm/` folder, never a .so."""
    target = container_package or load_pins().vllm_image_package_path
    host = package.absolute()
    mounts: list[str] = []
    for path in laid_files(host):
        mounts += ["-v", f"{host / path}:{target}/{path}:ro"]
    return mounts


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


# --- building ------------------------------------------------------------------------------------------------------

def rig_image(profile_name: str) -> RigImage:
    """The image a profile names (unknown profiles fail in the profile loader, with a suggestion)."""
    from rigstack.profiles import load_profile

    profile = load_profile(profile_name)
    if not profile.image:
        raise UserError(f"profile {profile.name} names no image; add `image: rigstack/{profile.name}:TAG` to it")
    return RigImage(profile.name, profile.image, profile.flavour)


def all_rig_images() -> list[RigImage]:
    """Every profile that names an image; two rigs sharing one tag would overwrite each other's image."""
    from rigstack.profiles import list_profiles, load_profile

    rigs: dict[str, RigImage] = {}
    for name in list_profiles():
        profile = load_profile(name)
        if not profile.image:
            continue  # it runs on the host
        rig = RigImage(profile.name, profile.image, profile.flavour)
        if rig.tag in rigs:
            raise UserError(f"profiles {rigs[rig.tag].rig} and {rig.rig} both name image {rig.tag}; give each rig "
                            f"its own tag (e.g. `image: rigstack/vllm:0.32.0-{rig.rig}`)")
        rigs[rig.tag] = rig
    return list(rigs.values())


def base_ref(pins: Pins, override: str | None = None, flavour: str = "gpu") -> tuple[str, str | None]:
    """The FROM reference and a warning, if any: the given base; for a CPU rig the local CPU serving base; else the
    pinned image, by digest when versions.env pins one and a tag (with a warning) otherwise."""
    from rigstack.localbase import cpu_base_tag

    if override:
        return override, None
    if flavour == "cpu":
        return cpu_base_tag(pins), None
    if not pins.vllm_image_digest:
        return pins.image_ref, (f"base {pins.vllm_image} is not pinned by digest; a tag can move under you. Fill "
                                "VLLM_IMAGE_DIGEST in versions.env (`docker inspect --format "
                                f"'{{{{index .RepoDigests 0}}}}' {pins.vllm_image}`)")
    return pins.image_ref, None


def patched_package(base: str, base_digest: str, pins: Pins, stack: Stack, package: Path | None = None) -> Path:
    """Bring a package to exactly `stack` with the applier (a no-op when it already is): by default the base
    image's own package, extracted once per base digest, so the laid files are changes against exactly what this
    base holds (a tag that moved gets a fresh extraction, not a stale one)."""
    from rigstack.applier import apply_stack
    from rigstack.baseline import DirSource, ImageSource

    if package is not None:
        source, out = DirSource(path=package.absolute()), None
    else:
        source = ImageSource(ref=base)
        default = source.default_out(pins)
        out = default.with_name(f"{default.name}-{base_digest.removeprefix('sha256:')[:12]}")
    result = apply_stack(source, stack, pins, out=out)
    if result.error:
        raise UserError(result.error)
    return source.package(pins, out)


def _copy_tool(root: Path, patches_dir: Path) -> None:
    """The tool baked into the image: library, preflight, profiles, the stack and the pins."""
    skip = shutil.ignore_patterns("__pycache__", "*.pyc")
    shutil.copytree(REPO_ROOT / "rigstack", root / "rigstack", ignore=skip)
    shutil.copytree(REPO_ROOT / "profiles", root / "profiles", ignore=skip)
    shutil.copytree(patches_dir, root / "patches", ignore=skip)
    for name in ("preflight.py", "versions.env"):
        if (REPO_ROOT / name).is_file():
            shutil.copy2(REPO_ROOT / name, root / name)


def _make_context(context: Path, package: Path, laid: list[str], manifest: dict, patches_dir: Path) -> None:
    shutil.copy2(DOCKERFILE, context / "Dockerfile")
    for path in laid:
        target = context / "package" / path
        target.parent.mkdir(parents=True, exist_ok=True)
        data, mode = _laid_file(package, path)
        target.write_bytes(data)
        target.chmod(mode)
    _copy_tool(context / "rigstack", patches_dir)
    (context / "rigstack" / "manifest.json").write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
    # Modes from the context become the image's: readable by any user the container runs as, whatever the umask.
    for path in context.rglob("*"):
        path.chmod(0o755 if path.is_dir() or path.stat().st_mode & 0o111 else 0o644)


def _laid_file(package: Path, path: str) -> tuple[bytes, int]:
    """A file the stack laid, read without following any link: a link in the package would otherwise put a host
    file (/etc/passwd, a key) into the build context and the image."""
    root = package.absolute()
    for folder in (root / path).relative_to(root).parents:
        if (root / folder).is_symlink():
            raise UserError(f"{root / folder} is a symlink; an image is built only from the package's own files: "
                            "remove the link and reapply")
    try:
        fd = os.open(root / path, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError as error:
        if error.errno == errno.ELOOP:
            raise UserError(f"{root / path} is a symlink; an image is built only from the package's own files: "
                            "remove the link and reapply") from None
        raise
    with os.fdopen(fd, "rb") as handle:
        info = os.fstat(handle.fileno())
        if not stat.S_ISREG(info.st_mode):
            raise UserError(f"{root / path} is not a regular file; remove it and reapply")
        return handle.read(), stat.S_IMODE(info.st_mode)


def _context_digest(context: Path) -> str:
    digest = hashlib.sha256()
    for path in sorted(p for p in context.rglob("*") if p.is_file()):
        digest.update(f"{path.relative_to(context).as_posix()}\0{_sha256(path.read_bytes())}\n".encode())
    return digest.hexdigest()


def cache_key(base_digest: str, stack_hash: str, dockerfile: str, build_args: dict[str, str], rig: str,
              context_digest: str) -> str:
    """Same inputs, same image: the base, the stack, the recipe, its arguments, the rig and what gets copied in."""
    payload = json.dumps({"base": base_digest, "stack": stack_hash, "dockerfile": _sha256(dockerfile.encode()),
                          "args": build_args, "rig": rig, "context": context_digest}, sort_keys=True)
    return "sha256:" + _sha256(payload.encode())


def _image_identity(image) -> str:  # noqa: ANN001 - a docker Image
    """The registry digest when the base came from a registry; the local image id for an imported stand-in."""
    digests = image.attrs.get("RepoDigests") or []
    return digests[0].split("@", 1)[1] if digests else image.id


def build_image(rig: RigImage, *, package: Path | None = None, base: str | None = None,
                patches_dir: Path = DEFAULT_PATCHES_DIR, force: bool = False,
                records_dir: Path = RECORDS_DIR) -> BuildResult:
    """Build (or reuse) one rig's image: cheap checks, then the applier, then the classic builder."""
    pins = load_pins()
    stack = load_stack(patches_dir)
    ref, warning = base_ref(pins, base, rig.flavour)
    warnings = (warning,) if warning else ()
    client = connect()
    base_image = local_image(client, ref, _base_fix(ref))
    base_digest = _image_identity(base_image)
    package = patched_package(ref, base_digest, pins, stack, package)
    laid = laid_files(package)
    stamp = read_stamp(package)
    assert stamp is not None  # the applier just wrote or confirmed it
    manifest = {"schema": MANIFEST_SCHEMA, "rig": rig.rig, "package_path": pins.vllm_image_package_path,
                "stack_hash": stamp.stack_hash, "patches": list(stamp.patch_ids),
                "files": {path: _sha256((package / path).read_bytes()) for path in laid}}
    build_args = {"BASE": ref, "VLLM_PACKAGE_PATH": pins.vllm_image_package_path, "RIG": rig.rig}
    with tempfile.TemporaryDirectory(prefix="rigstack-image-") as tmp:
        context = Path(tmp)
        _make_context(context, package, laid, manifest, patches_dir)
        key = cache_key(base_digest, stamp.stack_hash, DOCKERFILE.read_text(), build_args, rig.rig,
                        _context_digest(context))
        cached = None if force else _reusable(client, key, patches_dir)
        if cached is not None:
            cached.tag(*split_tag(rig.tag))
            return _record(BuildResult(rig.rig, rig.tag, cached.id, key, built=False, base=ref, laid=len(laid),
                                       warnings=warnings), records_dir)
        source, revision = checkout_revision(REPO_ROOT)
        labels = {
            f"{OCI}title": f"rigstack {rig.rig}",
            f"{OCI}source": source,
            f"{OCI}revision": revision,
            f"{OCI}version": f"{__version__}+vllm{pins.vllm_version}",
            f"{OCI}created": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
            f"{OCI}base.name": ref,
            f"{OCI}base.digest": base_digest,
            f"{LABEL}rig": rig.rig,
            f"{LABEL}stack-hash": stamp.stack_hash,
            f"{LABEL}patches": ",".join(stamp.patch_ids),
            f"{LABEL}package-path": pins.vllm_image_package_path,
            f"{LABEL}manifest": MANIFEST,
            # The manifest lives inside the image; its hash in the config lets verify catch an edited manifest.
            f"{LABEL}manifest-sha256": _sha256((context / "rigstack" / "manifest.json").read_bytes()),
            f"{LABEL}cache-key": key,
        }
        # One LABEL instruction, added after the cache key was taken (created changes on every build); the
        # builder's own labels parameter would cost one step and one container per label.
        with (context / "Dockerfile").open("a") as dockerfile:
            dockerfile.write("LABEL " + " \\\n      ".join(f"{name}={json.dumps(value)}"
                                                        for name, value in sorted(labels.items())) + "\n")
        image_id, log = _stream_build(client, context, rig.tag, build_args)
    return _record(BuildResult(rig.rig, rig.tag, image_id, key, built=True, base=ref, laid=len(laid),
                               warnings=warnings, log=tuple(log)), records_dir)


def _reusable(client: docker.DockerClient, key: str, patches_dir: Path):  # noqa: ANN202 - a docker Image or None
    """An image built with this cache key that still verifies. Labels are inherited, so an image made from a rig
    image (a `docker commit` of an edited container, say) carries the same key: only a clean one is reused."""
    for image in client.images.list(filters={"label": f"{LABEL}cache-key={key}"}):
        if verify_image(image.id, patches_dir).ok:
            return image
    return None


def _stream_build(client: docker.DockerClient, context: Path, tag: str,
                  build_args: dict[str, str]) -> tuple[str, list[str]]:
    """Run the classic builder; its output lines, and its errorDetail as the one-line failure."""
    image_id = None
    log: list[str] = []
    try:
        for chunk in client.api.build(path=str(context), tag=tag, buildargs=build_args, rm=True, forcerm=True,
                                      pull=False, decode=True):
            if "errorDetail" in chunk:
                message = chunk["errorDetail"].get("message") or chunk.get("error", "unknown error")
                tail = "; ".join(log[-3:]) or "no build output"
                raise UserError(f"docker build of {tag} failed: {message.strip()} (after: {tail})")
            if chunk.get("stream", "").strip():
                log.append(chunk["stream"].rstrip("\n"))
            if "aux" in chunk and "ID" in chunk["aux"]:
                image_id = chunk["aux"]["ID"]
    except docker.errors.APIError as error:
        raise UserError(f"docker build of {tag} failed: {error.explanation or error}") from None
    if image_id is None:
        raise UserError(f"docker build of {tag} reported no image id; rerun with `docker build` to see why")
    return image_id, log


def _record(result: BuildResult, records_dir: Path) -> BuildResult:
    """The last build of each rig, for people and for the launcher: build/images/RIG.json."""
    record = {name: getattr(result, name) for name in ("rig", "tag", "image_id", "cache_key", "built", "base")}
    write_atomic(records_dir / f"{result.rig}.json", json.dumps(record, indent=2) + "\n")
    return result


# --- verifying -----------------------------------------------------------------------------------------------------

def verify_image(image: str, patches_dir: Path = DEFAULT_PATCHES_DIR) -> VerifyReport:
    """Re-hash the laid files inside an image (read out of a never-started container) against its manifest, and
    its labels and stamp against the current stack. Preflight calls this for a profile's image."""
    client = connect()
    labels = local_image(client, image, "build it with `python -m rigstack.images build --profile RIG`").labels
    labels = labels or {}
    if f"{LABEL}manifest" not in labels:
        return VerifyReport(image, (ImageCheck("labels", False, f"{image} has no {LABEL}* labels: not a rigstack "
                                               "image; build one with `python -m rigstack.images build`"),))
    rebuild = f"rebuild with `python -m rigstack.images build --profile {labels.get(LABEL + 'rig', 'RIG')}`"
    current = load_stack(patches_dir).stack_hash
    checks = [ImageCheck("stack", labels[f"{LABEL}stack-hash"] == current,
                         f"built for stack {labels[f'{LABEL}stack-hash'][:19]}, patches/ is {current[:19]}"
                         + ("" if labels[f"{LABEL}stack-hash"] == current else f"; {rebuild}"))]
    with _created(client, image) as container:
        raw = _read_file(container, labels[f"{LABEL}manifest"])
        if raw is None:
            return VerifyReport(image, (*checks, ImageCheck("manifest", False, f"{labels[f'{LABEL}manifest']} is "
                                                            f"missing from the image; {rebuild}")))
        manifest = json.loads(raw)
        same = (_sha256(raw) == labels.get(f"{LABEL}manifest-sha256")
                and manifest["stack_hash"] == labels[f"{LABEL}stack-hash"])
        checks.append(ImageCheck("manifest", same, f"{len(manifest['files'])} laid file(s), stack "
                                 f"{manifest['stack_hash'][:19]}" + ("" if same else " (edited after the build; "
                                                                         f"{rebuild})")))
        shadowing = [path for path in manifest["files"] if path.endswith(".so") or ".so." in path]
        checks.append(ImageCheck("no .so laid", not shadowing,
                                 f"laid over compiled extensions: {', '.join(shadowing)}" if shadowing
                                 else "the base's compiled extensions are its own"))
        for path, expected in sorted(manifest["files"].items()):
            data = _read_file(container, f"{manifest['package_path']}/{path}")
            if data is None:
                checks.append(ImageCheck(f"vllm/{path}", False, f"missing from the image; {rebuild}"))
            elif (actual := _sha256(data)) != expected:
                checks.append(ImageCheck(f"vllm/{path}", False, f"sha256 {actual[:12]} differs from the manifest's "
                                         f"{expected[:12]}: the file drifted; {rebuild}"))
            elif path == STAMP_NAME and json.loads(data).get("stack_hash") != manifest["stack_hash"]:
                checks.append(ImageCheck(f"vllm/{path}", False, f"stamp names another stack; {rebuild}"))
            else:
                checks.append(ImageCheck(f"vllm/{path}", True, f"sha256 {actual[:12]}"))
    return VerifyReport(image, tuple(checks))


def verify_profile_image(profile_name: str, patches_dir: Path = DEFAULT_PATCHES_DIR) -> VerifyReport:
    return verify_image(rig_image(profile_name).tag, patches_dir)


# --- a running container ------------------------------------------------------------------------------------------

def container_stamp(url: str) -> tuple[str, Stamp | None] | None:
    """The running container that publishes url's port on this host, as "container NAME:PACKAGE_PATH", and the
    stamp of the vllm package inside it (read through the docker API, never from the host's package); None when
    no daemon answers or no container publishes that port."""
    port = str(urlsplit(url).port or 80)
    try:
        client = connect()
    except UserError:
        return None
    for container in client.containers.list():
        published = [binding.get("HostPort") for bindings in (container.ports or {}).values() for binding in
                     bindings or ()]
        if port not in published:
            continue
        labels = container.image.labels or {}
        path = labels.get(f"{LABEL}package-path") or load_pins().vllm_image_package_path
        raw = _read_file(container, f"{path}/{STAMP_NAME}")
        return f"container {container.name}:{path}", Stamp.from_dict(json.loads(raw)) if raw else None
    return None
