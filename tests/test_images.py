"""rigstack.images against a real dockerd: a rig image built over the local stand-in base, run, verified, tampered."""

from __future__ import annotations

import hashlib
import json
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from rigstack import localbase, rigimages
from rigstack.errors import UserError
from rigstack.stack import load_stack
from rigstack.versions import REPO_ROOT, load_pins
from testing.patches import PatchMaker

PINS = load_pins()
SITE = str(Path(PINS.vllm_image_package_path).parent)
TAG = "rigstack-test/test-rig:ci"
PROBE = "utils/math_utils.py"  # imports only the standard library: importable in the stand-in without torch
HEAVY = "logger.py"  # needs the whole vLLM environment to import; compiled only
GIT_ENV = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@t", "GIT_CONFIG_GLOBAL": os.devnull, "GIT_CONFIG_NOSYSTEM": "1"}


def _git(cwd: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=cwd, env=GIT_ENV, check=True, capture_output=True, text=True).stdout


def _write_stack(patch_maker: PatchMaker, folder: Path, word: str) -> Path:
    """A one-patch stack: a probe function in a module that imports without torch, a comment in one that needs
    the whole vLLM environment (compiled only)."""
    edits = {PROBE: patch_maker.read(PROBE) + f'\n\ndef rigstack_probe() -> str:\n    return "{word}"\n',
             **patch_maker.edit(HEAVY, '"""Logging configuration for vLLM."""',
                                '"""Logging configuration for vLLM."""\n# laid by rigstack')}
    patch_maker.write(folder, "0001-image-probe.patch", edits, subject="test: a probe function for the image tests")
    return folder


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _cli(*args: str, env: dict[str, str] | None = None, cwd: Path = REPO_ROOT) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "rigstack.images", *args], cwd=cwd, capture_output=True, text=True,
                          env={**os.environ, "COLUMNS": "1000", **(env or {})}, timeout=300)


# --- no daemon needed ----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("path, words", [
    ("_C.abi3.so", "compiled extension"), ("sub/libx.so.1", "compiled extension"), (".", "folder"),
    ("parser/", "folder"), ("../etc/passwd", "outside"), ("/abs.py", "outside")])
def test_guard_refuses_what_would_shadow_the_base(path: str, words: str) -> None:
    with pytest.raises(UserError, match=words):
        rigimages.guard_laid([path])


def test_guard_refuses_a_folder_of_the_package(tmp_path: Path) -> None:
    (tmp_path / "parser").mkdir()
    assert rigimages.guard_laid(["b.py", "a/x.py", "b.py"], tmp_path) == ["a/x.py", "b.py"]
    with pytest.raises(UserError, match="folder"):
        rigimages.guard_laid(["parser"], tmp_path)


def test_daemon_not_running_is_one_line_with_the_fix(tmp_path: Path) -> None:
    done = _cli("verify-image", TAG, env={"DOCKER_HOST": f"unix://{tmp_path}/no-daemon.sock"})
    assert done.returncode == 1
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert "no docker daemon is reachable" in lines[0] and "dockerd" in lines[0]


def test_a_daemon_dripping_its_answer_is_one_line_within_the_deadline() -> None:
    """Issue 39 item 6: a DOCKER_HOST that answers a header byte at a time held `image verify` forever."""
    listener = socket.create_server(("127.0.0.1", 0))
    stop = threading.Event()

    def drip() -> None:
        connection, _ = listener.accept()
        with connection:
            connection.sendall(b"HTTP/1.1 200 OK\r\nX-Slow: ")
            while not stop.wait(0.3):
                connection.sendall(b"a")

    threading.Thread(target=drip, daemon=True).start()
    started = time.monotonic()
    try:
        done = _cli("verify-image", TAG, env={"DOCKER_HOST": f"tcp://127.0.0.1:{listener.getsockname()[1]}"})
    finally:
        stop.set()
        listener.close()
    took = time.monotonic() - started
    assert done.returncode == 1 and len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert "did not answer within 15 s; check DOCKER_HOST" in done.stderr
    assert took < 15 + 30  # the deadline, plus the CLI's start on a loaded machine


def test_unknown_profile_is_refused_before_docker() -> None:
    done = _cli("build", "--profile", "no-such-rig", env={"DOCKER_HOST": "unix:///nonexistent.sock"})
    assert done.returncode == 1
    assert "no-such-rig" in done.stderr and "daemon" not in done.stderr


def test_build_needs_a_profile_or_all() -> None:
    done = _cli("build")
    assert done.returncode == 1 and "--profile NAME" in done.stderr


# --- against the real daemon ---------------------------------------------------------------------------------------

def test_the_build_context_never_follows_a_link(tmp_path: Path) -> None:
    secret = tmp_path / "host-secret"
    secret.write_text("root:x:0:0:host only\n")
    package = tmp_path / "vllm"
    package.mkdir()
    (package / "ok.py").write_text("X = 1\n")
    (package / "evil_link").symlink_to(secret)
    (package / "linked").symlink_to(tmp_path)
    for laid in (["ok.py", "evil_link"], ["ok.py", "linked/host-secret"]):
        context = tmp_path / f"context-{len(laid[1])}"
        context.mkdir()
        with pytest.raises(UserError, match="is a symlink"):
            rigimages._make_context(context, package, laid, {}, REPO_ROOT / "patches")
        assert all("host only" not in path.read_text(errors="replace") for path in context.rglob("*")
                   if path.is_file())


def test_the_source_label_carries_no_credentials(tmp_path: Path) -> None:
    from rigstack.gitrepo import checkout_revision

    _git(tmp_path, "init", "-q")
    _git(tmp_path, "commit", "-q", "--allow-empty", "-m", "x")
    for url, shown in [("https://oauth2:glpat-SECRET1@gitlab.example/o/r.git", "https://gitlab.example/o/r.git"),
                       ("https://ghp_SECRET2@github.com/o/r", "https://github.com/o/r"),
                       ("ghp_SECRET3@github.com:o/r.git", "github.com:o/r.git"),
                       # issue 28 item 29: forms no URL parser reads, which git still takes as a remote
                       ("https:user:SECRET4@host/x.git", "host/x.git"), ("host/user:SECRET5@x.git", "host/x.git"),
                       ("https://host/o/user:SECRET6@r.git", "https://host/o/r.git")]:
        _git(tmp_path, "remote", "remove", "origin") if "origin" in _git(tmp_path, "remote") else None
        _git(tmp_path, "remote", "add", "origin", url)
        source, _ = checkout_revision(tmp_path)
        assert source == shown and "SECRET" not in source


@pytest.fixture(scope="module")
def standin(client) -> str:  # noqa: ANN001
    return localbase.make_standin().tag


@pytest.fixture(scope="module")
def work(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("images")


@pytest.fixture(scope="module")
def stack_dir(patch_maker: PatchMaker, work: Path) -> Path:
    return _write_stack(patch_maker, work / "patches", "laid by rigstack")


@pytest.fixture(scope="module")
def built(client, standin: str, stack_dir: Path, work: Path) -> Iterator[rigimages.BuildResult]:  # noqa: ANN001
    # The applier patches the base image's own package under build/ of the working folder.
    old = Path.cwd()
    os.chdir(work)
    try:
        # force: an image left by an earlier run must not stand in for a real build here.
        result = rigimages.build_image(rigimages.RigImage("test-rig", TAG), base=standin, patches_dir=stack_dir,
                                    force=True, records_dir=work / "records")
    finally:
        os.chdir(old)
    yield result
    client.images.remove(TAG, force=True)


def _run(client, image: str, code: str, volumes: list[str] | None = None) -> str:  # noqa: ANN001
    args = ["docker", "run", "--rm", *(volumes or []), image, "python3", "-c", code]
    done = subprocess.run(args, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    return done.stdout


# What a container says about its package: the patched probe's answer (None in the pristine base), the stamp's
# stack, the manifest, the compiled canaries' hashes and the top-level file count.
PROBE_CODE = f"""
import hashlib, importlib.util, json, os, py_compile
pkg = {PINS.vllm_image_package_path!r}
def load(path):
    return json.load(open(path)) if os.path.exists(path) else None
spec = importlib.util.spec_from_file_location("probe", pkg + "/{PROBE}")
module = importlib.util.module_from_spec(spec)
spec.loader.exec_module(module)
py_compile.compile(pkg + "/{HEAVY}", cfile="/tmp/heavy.pyc", doraise=True)
sos = sorted(name for name in os.listdir(pkg) if name.endswith(".so"))
print(json.dumps({{
    "probe": getattr(module, "rigstack_probe", lambda: None)(),
    "stamp": (load(pkg + "/rigstack_stamp.json") or {{}}).get("stack_hash"),
    "manifest": load("/opt/rigstack/manifest.json"),
    "so": {{name: hashlib.sha256(open(pkg + "/" + name, "rb").read()).hexdigest() for name in sos}},
    "files": len(os.listdir(pkg)),
}}))
"""


@pytest.mark.docker
def test_build_lays_the_patched_package_in_place(client, built: rigimages.BuildResult, standin: str,  # noqa: ANN001
                                                 stack_dir: Path, work: Path) -> None:
    assert built.built and built.image_id.startswith("sha256:")
    assert client.images.get(TAG).id == built.image_id
    inside = json.loads(_run(client, TAG, PROBE_CODE))
    stack_hash = load_stack(stack_dir).stack_hash
    assert inside["probe"] == "laid by rigstack"
    assert inside["stamp"] == stack_hash
    assert inside["manifest"]["stack_hash"] == stack_hash
    assert set(inside["manifest"]["files"]) == {PROBE, HEAVY, "rigstack_stamp.json"}
    host = next((work / "build").glob("image-*/vllm"))
    laid = inside["manifest"]["files"]
    assert laid == {path: _sha((host / path).read_bytes()) for path in laid}
    # Nothing was shadowed: the compiled canaries and the file count are the base's own.
    base = json.loads(_run(client, standin, PROBE_CODE))
    assert (base["probe"], base["stamp"], base["manifest"]) == (None, None, None)
    assert inside["so"] == base["so"] and len(inside["so"]) >= 1
    assert inside["files"] == base["files"] + 1  # only the stamp is new at the top level
    record = json.loads((work / "records" / "test-rig.json").read_text())
    assert record["image_id"] == built.image_id and record["cache_key"] == built.cache_key


@pytest.mark.docker
def test_labels_say_what_the_image_is(client, built: rigimages.BuildResult, standin: str,  # noqa: ANN001
                                      stack_dir: Path) -> None:
    labels = client.images.get(TAG).labels
    for key in ("source", "revision", "version", "created", "base.name", "base.digest"):
        assert labels[f"org.opencontainers.image.{key}"], key
    assert labels["org.opencontainers.image.base.name"] == standin
    assert labels["org.opencontainers.image.base.digest"] == client.images.get(standin).id
    assert labels["org.rigstack.rig"] == "test-rig"
    assert labels["org.rigstack.stack-hash"] == load_stack(stack_dir).stack_hash
    assert labels["org.rigstack.patches"] == "0001"
    assert labels["org.rigstack.cache-key"] == built.cache_key


@pytest.mark.docker
def test_unchanged_rig_is_not_rebuilt(built: rigimages.BuildResult, standin: str, stack_dir: Path,
                                      work: Path) -> None:
    old = Path.cwd()
    os.chdir(work)
    try:
        again = rigimages.build_image(rigimages.RigImage("test-rig", TAG), base=standin, patches_dir=stack_dir,
                                   records_dir=work / "records")
    finally:
        os.chdir(old)
    assert not again.built
    assert (again.image_id, again.cache_key) == (built.image_id, built.cache_key)


@pytest.mark.docker
def test_verify_passes_on_a_good_image(built: rigimages.BuildResult, stack_dir: Path) -> None:
    report = rigimages.verify_image(TAG, stack_dir)
    assert report.ok, report.failures
    assert {check.name for check in report.checks} >= {f"vllm/{PROBE}", f"vllm/{HEAVY}", "stack", "manifest"}
    done = _cli("verify-image", TAG, "--patches", str(stack_dir))
    assert done.returncode == 0, done.stderr
    assert "PASS" in done.stderr


@pytest.mark.docker
def test_verify_fails_on_a_tampered_image_naming_the_file(client, built: rigimages.BuildResult,  # noqa: ANN001
                                                          stack_dir: Path) -> None:
    target = f"{PINS.vllm_image_package_path}/{PROBE}"
    container = client.containers.run(TAG, ["python3", "-c", f"open({target!r}, 'a').write('# edited\\n')"],
                                      detach=True)
    try:
        assert container.wait()["StatusCode"] == 0
        container.commit("rigstack-test/test-rig", "tampered")
    finally:
        container.remove(force=True)
    try:
        report = rigimages.verify_image("rigstack-test/test-rig:tampered", stack_dir)
        assert [check.name for check in report.failures] == [f"vllm/{PROBE}"]
        done = _cli("verify-image", "rigstack-test/test-rig:tampered", "--patches", str(stack_dir))
        assert done.returncode == 2
        assert f"FAIL rigstack-test/test-rig:tampered: vllm/{PROBE}" in " ".join(done.stderr.split())
    finally:
        client.images.remove("rigstack-test/test-rig:tampered", force=True)


@pytest.mark.docker
def test_verify_fails_when_the_stack_moved_on(built: rigimages.BuildResult, patch_maker: PatchMaker,
                                               work: Path) -> None:
    newer = _write_stack(patch_maker, work / "patches-newer", "a newer stack")
    report = rigimages.verify_image(TAG, newer)
    assert [check.name for check in report.failures] == ["stack"]
    assert "rebuild" in report.failures[0].detail


@pytest.mark.docker
def test_verify_fails_on_an_image_rigstack_did_not_build(standin: str, stack_dir: Path) -> None:
    report = rigimages.verify_image(standin, stack_dir)
    assert not report.ok and report.failures[0].name == "labels"


@pytest.mark.docker
def test_missing_base_says_how_to_get_one(client, stack_dir: Path) -> None:  # noqa: ANN001
    with pytest.raises(UserError, match=r"not present locally; pull it with `docker pull rigstack-test/no-base:1`.*"
                                        r"rigstack.images base --standin"):
        rigimages.build_image(rigimages.RigImage("test-rig", "rigstack-test/never:1"), base="rigstack-test/no-base:1",
                           patches_dir=stack_dir)


@pytest.mark.docker
def test_stack_that_does_not_apply_fails_before_any_build(client, standin: str, patch_maker: PatchMaker,  # noqa: ANN001
                                                          work: Path) -> None:
    broken = _write_stack(patch_maker, work / "patches-broken", "x")
    patch = next(broken.glob("*.patch"))
    patch.write_text(patch.read_text().replace("     return values[i] if", "     return values[j] if", 1))
    old = Path.cwd()
    os.chdir(work)
    try:
        with pytest.raises(UserError, match="0001-image-probe.patch"):
            rigimages.build_image(rigimages.RigImage("test-rig", "rigstack-test/never:1"), base=standin,
                               patches_dir=broken, force=True)
    finally:
        os.chdir(old)
    assert not client.images.list(name="rigstack-test/never")


@pytest.mark.docker
def test_bind_mounts_lay_only_the_changed_files(client, built: rigimages.BuildResult, standin: str,  # noqa: ANN001
                                                work: Path, stack_dir: Path) -> None:
    package = next((work / "build").glob("image-*/vllm"))
    mounts = rigimages.bind_mounts(package)
    specs = mounts[1::2]
    assert mounts[::2] == ["-v"] * len(specs)
    assert sorted(spec.split(":")[1].removeprefix(PINS.vllm_image_package_path + "/") for spec in specs) == \
        sorted([HEAVY, PROBE, "rigstack_stamp.json"])
    assert all(spec.endswith(":ro") and not spec.split(":")[0].endswith(".so") for spec in specs)
    inside = json.loads(_run(client, standin, PROBE_CODE, mounts))
    assert inside["probe"] == "laid by rigstack"
    assert inside["stamp"] == load_stack(stack_dir).stack_hash


@pytest.mark.docker
def test_verify_catches_a_manifest_edited_to_match(client, built: rigimages.BuildResult,  # noqa: ANN001
                                                   stack_dir: Path) -> None:
    target = f"{PINS.vllm_image_package_path}/{PROBE}"
    code = (f"import hashlib, json\nopen({target!r}, 'a').write('# edited\\n')\n"
            f"m = json.load(open({rigimages.MANIFEST!r}))\n"
            f"m['files'][{PROBE!r}] = hashlib.sha256(open({target!r}, 'rb').read()).hexdigest()\n"
            f"json.dump(m, open({rigimages.MANIFEST!r}, 'w'), indent=2, sort_keys=True)\n")
    container = client.containers.run(TAG, ["python3", "-c", code], detach=True)
    try:
        assert container.wait()["StatusCode"] == 0
        container.commit("rigstack-test/test-rig", "forged")
    finally:
        container.remove(force=True)
    try:
        report = rigimages.verify_image("rigstack-test/test-rig:forged", stack_dir)
        assert [check.name for check in report.failures] == ["manifest"]
        assert "edited after the build" in report.failures[0].detail
    finally:
        client.images.remove("rigstack-test/test-rig:forged", force=True)
