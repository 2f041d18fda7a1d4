"""Talking to servers that are not there, that want a key, or that speak Prometheus."""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import pytest

from rigstack.client import parse_prometheus
from testing.probes import ROOT, last_line, run_script

DEAD = "http://127.0.0.1:9/v1"  # port 9 (discard) is never served here

SCRIPTS = [("bench.py",), ("conc.py",), ("needle.py",), ("qual.py",), ("probe_bang.py", "run")]


@pytest.mark.parametrize("command", SCRIPTS, ids=[c[0] for c in SCRIPTS])
def test_unreachable_url_is_one_line(tmp_path: Path, command: tuple[str, ...]) -> None:
    process = run_script(*command, "--url", DEAD, "--model", "tiny", "--out", str(tmp_path / "r"), cwd=tmp_path)
    assert process.returncode == 1
    assert last_line(process) == ("error: cannot reach http://127.0.0.1:9: ConnectError; start the server with "
                                  "`python scripts/run_prod.py --profile NAME`")
    assert not list(tmp_path.iterdir())  # nothing half-written


@pytest.mark.parametrize(("url", "expected"), [
    ("http://[::1", "--url 'http://[::1' is not a URL (Invalid IPv6 URL)"),
    ("http://127.0.0.1:8000\n/v1", "holds a space or a control character; give the server's URL alone"),
    ("http://127.0.0.1:99999/v1", "is not a URL (Port out of range 0-65535)"),
    ("ftp://127.0.0.1/v1", "give an http:// or https:// URL with a host"),  # was told to "start the server"
    ("http://alice:pw-planted@[::1/v1", "--url '[::1/v1' is not a URL"),  # the credentials never shown
])
def test_a_url_that_is_no_http_url_is_one_line(tmp_path: Path, url: str, expected: str) -> None:
    """Issue 39 item 12 and its Low list: these were `bug:` crashes (ValueError, InvalidURL) or the wrong fix."""
    process = run_script("bench.py", "--url", url, "--model", "tiny", "--out", str(tmp_path / "r"), cwd=tmp_path)
    assert process.returncode == 1 and last_line(process).startswith("error: ") and expected in last_line(process)
    assert "pw-planted" not in process.stderr and not list(tmp_path.iterdir())


def test_api_key_comes_from_env_and_is_never_written(tmp_path: Path, fake_server) -> None:
    url = fake_server()
    env = {**os.environ, "PROBE_TEST_KEY": "sekrit-123"}
    process = run_script("bench.py", "--url", url, "--model", "fake", "--api-key-env", "PROBE_TEST_KEY",
                         "--workload", "code", "--max-tokens", "4", "--out", str(tmp_path / "b"), env=env)
    assert process.returncode == 0, process.stderr
    written = (tmp_path / "b.json").read_text() + (tmp_path / "b.csv").read_text()
    assert "sekrit" not in written + process.stdout + process.stderr
    assert json.loads((tmp_path / "b.json").read_text())["rows"][0]["tokens"] == 12  # 3 prompts x 4 tokens


def test_missing_key_variable(tmp_path: Path) -> None:
    env = {key: value for key, value in os.environ.items() if key != "PROBE_TEST_KEY"}
    process = run_script("qual.py", "--url", DEAD, "--model", "m", "--api-key-env", "PROBE_TEST_KEY", env=env)
    assert process.returncode == 1
    assert "API key variable PROBE_TEST_KEY is not set" in last_line(process)


def test_wrong_model_name(tmp_path: Path, fake_server) -> None:
    process = run_script("bench.py", "--url", fake_server(), "--model", "nope", "--out", str(tmp_path / "b"))
    assert process.returncode == 1
    assert "model 'nope' is not served at" in last_line(process) and "(served: fake)" in last_line(process)


def test_prometheus_sums_label_sets() -> None:
    text = ('# HELP vllm:generation_tokens_total x\n# TYPE vllm:generation_tokens_total counter\n'
            'vllm:generation_tokens_total{engine="0",model_name="a b"} 10.0\n'
            'vllm:generation_tokens_total{engine="1",model_name="a b"} 5.0\n'
            'vllm:num_requests_running{engine="0"} 2.0\n')
    assert parse_prometheus(text) == {"vllm:generation_tokens_total": 15.0, "vllm:num_requests_running": 2.0}


def test_results_default_to_the_results_folder(tmp_path: Path, fake_server) -> None:
    """Without --out nothing lands in the working folder: results/ (git-ignored) gets a fresh stem per run."""
    process = run_script("bench.py", "--url", fake_server(), "--model", "fake", "--workload", "code", cwd=tmp_path)
    assert process.returncode == 0, process.stderr
    wrote = re.search(r"wrote (\S+\.json), (\S+\.csv)", last_line(process))
    assert wrote, process.stderr
    written = [Path(path) for path in wrote.groups()]
    try:
        assert all(path.parent == ROOT / "results" and path.name.startswith("bench-") for path in written)
        assert json.loads(written[0].read_text())["kind"] == "bench" and written[1].is_file()
        assert not list(tmp_path.iterdir())
        ignored = subprocess.run(["git", "check-ignore", "-q", str(written[0])], cwd=ROOT)
        assert ignored.returncode == 0  # git status stays clean
    finally:
        for path in written:
            path.unlink(missing_ok=True)


def test_behind_a_gateway_the_counters_are_the_models_engines(fake_server) -> None:
    """A fleet's gateway has no vLLM counters: with `engines`, the server's counters are those engines' sums, read
    by the sync and the async path alike (issue 30: the probes take the gateway's URL)."""
    import asyncio

    import httpx

    from rigstack.client import Endpoint, Server

    gateway, engines = fake_server(), (fake_server("--metrics"), fake_server("--metrics"))
    for count, engine in zip((1, 2), engines):
        for _ in range(count):
            assert httpx.post(engine + "/v1/chat/completions", json={"model": "fake", "stream": True, "messages": [
                {"role": "user", "content": "x"}]}, timeout=30).status_code == 200
    alone = [Server(Endpoint(engine, "fake")).metrics() for engine in engines]
    assert Server(Endpoint(gateway, "fake")).metrics() is None  # the gateway alone measures nothing
    behind = Server(Endpoint(gateway, "fake"), engines=engines)
    summed = behind.metrics()
    assert summed == {name: alone[0][name] + alone[1][name] for name in alone[0]}
    assert summed["vllm:request_decode_time_seconds_count"] == 3

    async def scraped() -> dict[str, float] | None:
        async with behind.session() as session:
            return await behind.scrape(session)

    assert asyncio.run(scraped()) == summed


def test_an_engine_down_behind_a_live_gateway_is_named(fake_server) -> None:
    """Issue 39 (Low): with --fleet, an engine that is down was reported as the gateway being unreachable (the
    gateway answered; the hint said to start it). The error names the engine, the gateway it is behind, and how to
    restart the fleet."""
    from rigstack.client import Endpoint, Server
    from rigstack.errors import UserError
    from testing.net import free_port

    gateway, live = fake_server(), fake_server("--metrics")
    dead = f"http://127.0.0.1:{free_port()}"
    with pytest.raises(UserError) as raised:
        Server(Endpoint(gateway, "fake"), engines=(live, dead)).metrics()
    message = str(raised.value)
    assert message.startswith(f"cannot reach {dead}, an engine behind the gateway {gateway} (--fleet): ConnectError")
    assert "--fleet NAME" in message and "stop --fleet NAME" in message and "\n" not in message
