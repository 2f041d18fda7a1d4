"""Fixtures for the probe tests (the vLLM server fixtures come from testing.server, loaded by the root
conftest): a small failing HTTP server process."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable, Iterator

import pytest

from testing.net import free_port
from testing.probes import FAKE_SERVER


@pytest.fixture
def fake_server() -> Iterator[Callable[..., str]]:
    """factory(*args, env=None) -> base URL of a running fake_server.py; every one is stopped afterwards."""
    started: list[subprocess.Popen[str]] = []

    def start(*args: str, env: dict[str, str] | None = None) -> str:
        port = free_port()
        process = subprocess.Popen([sys.executable, str(FAKE_SERVER), str(port), *args], stdout=subprocess.PIPE,
                                   text=True, env=env)
        started.append(process)
        assert process.stdout is not None and process.stdout.readline().strip() == "ready"
        return f"http://127.0.0.1:{port}"

    yield start
    for process in started:
        process.terminate()
        process.wait(timeout=10)
