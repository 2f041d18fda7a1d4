"""The image path served for real: the local CPU serving base, the cpu-tiny-docker rig image built on it with the
real stack, verified, preflighted, started by run_prod through docker, probed and stopped; the same base with the
patched files bind-mounted gives the same greedy tokens; a container that dies says why."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from rigstack import localbase, render, rigimages
from rigstack.preflight.core import Context, Status
from rigstack.preflight.image import image as image_check
from rigstack.profiles import load_profile
from rigstack.stack import load_stack
from rigstack.stamp import read_stamp
from rigstack.versions import REPO_ROOT, load_pins
from testing.net import free_port
from testing.server import server_env

PINS = load_pins()
BASE = localbase.cpu_base_tag(PINS)
PROFILE = "cpu-tiny-docker"
PROMPT = "The server has four cards and"
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "weather for a city", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]


def _run(args: list[str], env: dict[str, str] | None = None, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *args], check=False, cwd=REPO_ROOT, capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, "COLUMNS": "250", **(env or {})})


def _overlay(folder: Path, name: str, **fields: object) -> Path:
    """A profile extending cpu-tiny-docker on a free port (the box may serve something on 8000)."""
    path = folder / f"{name}.yaml"
    lines = [f"extends: {PROFILE}", f"port: {free_port()}", "health_timeout_s: 900"]
    path.write_text("\n".join(lines + [f"{key}: {json.dumps(value)}" for key, value in fields.items()]) + "\n")
    return path


# --- no daemon needed ----------------------------------------------------------------------------------------------

def test_local_base_tags_follow_versions_env() -> None:
    moved = dataclasses.replace(PINS, vllm_version="0.99.1")
    assert localbase.cpu_base_tag(moved) == "rigstack/vllm-openai-cpu:v0.99.1"
    assert localbase.standin_tag(moved) == "rigstack/vllm-openai-standin:v0.99.1"
    assert BASE == f"rigstack/vllm-openai-cpu:v{PINS.vllm_version}"


def test_the_library_returns_warnings_instead_of_printing(capsys: pytest.CaptureFixture[str]) -> None:
    ref, warning = rigimages.base_ref(dataclasses.replace(PINS, vllm_image_digest=""))
    assert ref == PINS.image_ref and "not pinned by digest" in (warning or "")
    assert rigimages.base_ref(PINS, flavour="cpu") == (BASE, None)
    assert capsys.readouterr() == ("", "")


def test_the_docker_profile_mounts_the_model_read_only_and_caps_memory(tmp_path: Path) -> None:
    argv = render.docker_run(load_profile(PROFILE), model=tmp_path)
    assert argv[:2] == ["docker", "run"] and f"{tmp_path}:{tmp_path}:ro" in argv
    assert argv[argv.index("--memory") + 1] == "6g"
    assert argv[argv.index("--entrypoint") + 2] == "rigstack/vllm:0.34.0-cpu-tiny-docker"


def test_no_daemon_is_a_preflight_fail_naming_the_image(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path}/no-daemon.sock")
    result = image_check(Context(load_profile(PROFILE), model=None, package=None))
    assert result.status is Status.FAIL
    assert result.reason == "no docker daemon is reachable to check image rigstack/vllm:0.34.0-cpu-tiny-docker"
    assert "dockerd" in result.fix


# --- the base, the package read out of it, the rig image -----------------------------------------------------------

@pytest.fixture(scope="module")
def cpu_base(client) -> localbase.BaseImage:  # noqa: F811
    return localbase.make_cpu_base()


@pytest.fixture(scope="module")
def work(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("cpu-image")


@pytest.fixture(scope="module")
def applied(client, cpu_base: localbase.BaseImage, work: Path) -> dict:  # noqa: F811
    """apply.py on the base image, and every container start the daemon saw meanwhile."""
    since = time.time()
    done = _run(["apply.py", "apply", "--from", f"image:{BASE}", "--out", str(work / "pkg")], timeout=900)
    starts = list(client.events(since=since, until=time.time() + 1, decode=True,
                                filters={"type": "container", "event": "start"}))
    return {"done": done, "package": work / "pkg" / "vllm", "starts": starts}


@pytest.fixture(scope="module")
def rig(applied: dict, work: Path) -> rigimages.BuildResult:
    assert applied["done"].returncode == 0, applied["done"].stderr[-2000:]
    return rigimages.build_image(rigimages.rig_image(PROFILE), package=applied["package"], records_dir=work / "records")


@pytest.mark.docker
def test_the_cpu_base_is_cached_by_content(client, cpu_base: localbase.BaseImage) -> None:  # noqa: F811
    config = client.images.get(BASE).attrs["Config"]
    assert config["Entrypoint"] == ["vllm", "serve"]
    assert config["Labels"][f"{localbase.LABEL}base"] == cpu_base.key
    again = localbase.make_cpu_base()
    assert (again.how, again.image_id, again.key) == ("reused", cpu_base.image_id, cpu_base.key)
    assert again.seconds < 30


@pytest.mark.docker
def test_apply_reads_the_package_out_of_the_image_without_running_it(applied: dict) -> None:
    assert applied["done"].returncode == 0, applied["done"].stderr[-2000:]
    stamp = read_stamp(applied["package"])
    assert stamp is not None and stamp.source == f"image:{BASE}"
    assert stamp.flavour == "cpu" and stamp.baseline_fingerprint == PINS.fingerprint("cpu")
    assert stamp.stack_hash == load_stack().stack_hash
    assert applied["starts"] == [], "reading the package started a container"


@pytest.mark.docker
def test_verify_passes_on_the_rig_image_and_names_a_changed_file(client, rig: rigimages.BuildResult) -> None:  # noqa: F811
    assert rigimages.verify_image(rig.tag).ok
    laid = sorted(path for path in json.loads(_manifest(client, rig.tag))["files"] if path.endswith(".py"))
    target = f"{PINS.vllm_image_package_path}/{laid[0]}"
    container = client.containers.run(rig.tag, entrypoint=["python3", "-c", f"open({target!r}, 'a').write('#\\n')"],
                                      command=[], detach=True)
    try:
        assert container.wait()["StatusCode"] == 0
        container.commit("rigstack-test/cpu-tiny-docker", "changed")
    finally:
        container.remove(force=True)
    try:
        report = rigimages.verify_image("rigstack-test/cpu-tiny-docker:changed")
        assert [check.name for check in report.failures] == [f"vllm/{laid[0]}"]
        done = _run(["-m", "rigstack.images", "verify-image", "rigstack-test/cpu-tiny-docker:changed"])
        assert done.returncode == 2
        assert f"FAIL rigstack-test/cpu-tiny-docker:changed: vllm/{laid[0]}" in " ".join(done.stderr.split())
    finally:
        client.images.remove("rigstack-test/cpu-tiny-docker:changed", force=True)


def _manifest(docker_client, tag: str) -> str:
    container = docker_client.containers.create(tag, entrypoint=["true"], command=[])
    try:
        return rigimages._read_file(container, rigimages.MANIFEST).decode()
    finally:
        container.remove(force=True)


@pytest.mark.docker
def test_preflight_passes_the_rig_image_and_fails_a_missing_or_foreign_one(
        client, rig: rigimages.BuildResult, work: Path, patch_maker, pristine_cpu_tree: Path) -> None:  # noqa: F811
    good = image_check(Context(load_profile(PROFILE), model=None, package=None))
    assert good.status is Status.PASS and rig.tag in good.reason

    missing = image_check(Context(load_profile(_overlay(work, "missing", image="rigstack-test/absent:1")),
                                  model=None, package=None))
    assert missing.status is Status.FAIL
    assert missing.reason == "image rigstack-test/absent:1 is not present locally"
    assert missing.fix == "python -m rigstack.images build --profile missing"

    # An image rigstack built, from another stack: one patch over a copy of the pristine package.
    stack = work / "other-stack"
    patch_maker.write(stack, "0001-other.patch",
                      {"utils/math_utils.py": patch_maker.read("utils/math_utils.py") + "\n# another stack\n"})
    package = work / "other-pkg" / "vllm"
    shutil.copytree(pristine_cpu_tree, package)
    tag = "rigstack-test/other-stack:1"
    rigimages.build_image(rigimages.RigImage("other", tag, "cpu"), package=package, patches_dir=stack,
                       records_dir=work / "records")
    try:
        foreign = image_check(Context(load_profile(_overlay(work, "foreign", image=tag)), model=None, package=None))
        assert foreign.status is Status.FAIL
        assert foreign.reason.startswith(f"image {tag}: stack: built for stack {load_stack(stack).stack_hash[:19]}")
        assert foreign.fix == "python -m rigstack.images build --profile foreign"
    finally:
        client.images.remove(tag, force=True)


# --- served ----------------------------------------------------------------------------------------------------

def _serve(work: Path, profile: Path, run_dir: Path) -> dict:
    """run_prod up, a greedy completion, stop; what it printed and answered."""
    env = server_env(run_dir.with_suffix(".env"))
    started = _run(["scripts/run_prod.py", "--profile", str(profile), "--run-dir", str(run_dir)], env, timeout=1200)
    url = f"http://127.0.0.1:{load_profile(profile).port}"
    try:
        assert started.returncode == 0, started.stdout[-2000:] + started.stderr[-3000:]
        reply = httpx.post(url + "/v1/completions", timeout=300, json={
            "model": "tiny", "prompt": PROMPT, "max_tokens": 8, "temperature": 0, "return_token_ids": True})
        assert reply.status_code == 200, reply.text
        return {"started": started, "url": url, "tokens": reply.json()["choices"][0]["token_ids"], "env": env}
    except BaseException:
        _run(["scripts/run_prod.py", "stop", "--run-dir", str(run_dir)])
        raise


def _stop(docker_client, run_dir: Path, name: str, url: str) -> None:
    stopped = _run(["scripts/run_prod.py", "stop", "--run-dir", str(run_dir)])
    assert stopped.returncode == 0, stopped.stderr
    assert docker_client.containers.list(all=True, filters={"name": name}) == []
    with pytest.raises(httpx.TransportError):
        httpx.get(url + "/health", timeout=5)


@pytest.fixture(scope="module")
def served(client, rig: rigimages.BuildResult, work: Path) -> dict:  # noqa: F811
    """The rig image through run_prod: completion, a chat answer with a tool call, bench and probe_bang, stop."""
    profile = _overlay(work, "served")
    run_dir = work / "run-served"
    up = _serve(work, profile, run_dir)
    try:
        chat = httpx.post(up["url"] + "/v1/chat/completions", timeout=300, json={
            "model": "tiny", "max_tokens": 16, "temperature": 0, "tools": TOOLS,
            "tool_choice": {"type": "function", "function": {"name": "get_weather"}},
            "messages": [{"role": "user", "content": "What is the weather in Paris?"}]})
        probes = {}
        for kind, args in (("bench", ["scripts/bench.py", "--workload", "code", "--max-tokens", "16"]),
                           ("bang", ["scripts/probe_bang.py", "run", "--max-tokens", "16", "--repeats", "2"])):
            done = _run([*args, "--url", up["url"], "--model", "tiny", "--profile", "served", "--out",
                         str(work / kind)], timeout=600)
            probes[kind] = (done, json.loads((work / f"{kind}.json").read_text()) if done.returncode == 0 else None)
    finally:
        _stop(client, run_dir, "rigstack-served-0", up["url"])
    return {**up, "chat": chat, "probes": probes}


@pytest.mark.docker
@pytest.mark.server
def test_run_prod_serves_the_rig_image(served: dict, rig: rigimages.BuildResult) -> None:
    out = served["started"].stdout
    assert any(line.split()[:3] == ["PASS", "image", "image"] and f"{rig.tag} verified" in line
               for line in out.splitlines() if line.strip())
    assert "ready" in served["started"].stderr and len(served["tokens"]) == 8
    assert served["chat"].status_code == 200, served["chat"].text
    calls = served["chat"].json()["choices"][0]["message"]["tool_calls"]
    assert [call["function"]["name"] for call in calls] == ["get_weather"]


@pytest.mark.docker
@pytest.mark.server
def test_probes_name_the_stack_read_from_the_container(served: dict) -> None:
    stack = load_stack().stack_hash
    for kind, (done, result) in served["probes"].items():
        assert done.returncode == 0, f"{kind}: {done.stderr[-2000:]}"
        provenance = result["provenance"]
        assert provenance["stack_hash"] == stack, kind
        assert provenance["package"] == f"container rigstack-served-0:{PINS.vllm_image_package_path}", kind


@pytest.mark.docker
@pytest.mark.server
def test_the_bind_mount_launch_gives_the_rig_image_tokens(client, served: dict, applied: dict,  # noqa: F811
                                                         work: Path) -> None:
    profile = _overlay(work, "bound", image=BASE, docker={"bind_package": str(applied["package"])})
    argv = render.docker_run(load_profile(profile))
    mounts = [argv[i + 1] for i, word in enumerate(argv) if word == "-v"]
    laid = [spec for spec in mounts if spec.split(":")[1].startswith(PINS.vllm_image_package_path + "/")]
    assert laid and all(spec.endswith(":ro") and ".so" not in spec for spec in laid)
    run_dir = work / "run-bound"
    up = _serve(work, profile, run_dir)
    try:
        assert "PASS image" in up["started"].stdout and "mounted over its package" in up["started"].stdout
    finally:
        _stop(client, run_dir, "rigstack-bound-0", up["url"])
    assert up["tokens"] == served["tokens"]


@pytest.mark.docker
@pytest.mark.parametrize("case", ["bad flag", "port taken"])
def test_a_container_that_dies_says_why(client, rig: rigimages.BuildResult, work: Path, case: str) -> None:  # noqa: F811
    fields = {"vllm": {"no-such-flag": 1}} if case == "bad flag" else {}
    profile = _overlay(work, case.replace(" ", "-"), **fields)
    port = load_profile(profile).port
    with socket.socket() as holder:
        if case == "port taken":
            holder.bind(("127.0.0.1", port))  # bound, not listening: only docker's own bind finds it taken
        done = _run(["scripts/run_prod.py", "--profile", str(profile), "--run-dir", str(work / f"run-{port}"),
                     "--force"], server_env(work / f"env-{port}"), timeout=900)
    error = " ".join(done.stderr.split())
    assert done.returncode == 1, done.stderr[-3000:]
    cause = "vLLM rejected a flag" if case == "bad flag" else "the port is taken by another process"
    assert f"error: the server exited (code {'2' if case == 'bad flag' else '125'})" in error and cause in error
    assert ("unrecognized arguments: --no-such-flag" if case == "bad flag" else "address already in use") in error
    assert client.containers.list(all=True, filters={"name": f"rigstack-{case.replace(' ', '-')}-0"}) == []
