"""pytest plugin: tiny models and vLLM CPU servers started through rigstack.serving (register with
`pytest_plugins = ["testing.server"]`).

Fixtures:
    tiny_model (session) -> Path: the dense tiny model folder (rigstack.tinymodel.build_tiny_model("dense")).
    tiny_moe_model (session) -> Path: the MoE one.
    vllm_server (session) -> factory(model=None, extra_args=(), env=None, timeout_s=900) -> TestServer
        Serves `model` (default: tiny_model) as "tiny" on a free 127.0.0.1 port with this interpreter
        (sys.executable; PYTHONPATH decides patched vs pristine vllm). An identical request returns the running
        server. At most MAX_ALIVE servers run at once (each takes ~2.5 GiB; env RIGSTACK_TEST_MAX_SERVERS, default
        1): asking for another stops the oldest. Servers of one session share a vLLM compile cache. Every server
        is stopped at session end.
        TestServer: url ("http://127.0.0.1:PORT"), model ("tiny"), run_dir, log (Path), stage_s (boot stage
        timings), completion(prompt, **params) -> dict, chat(messages, **params) -> dict (greedy by default).
Use `@pytest.mark.server` on tests that take these servers.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from rigstack.serving import process, ready
from rigstack.tinymodel import SERVED_NAME, build_tiny_model
from testing.net import free_port

MAX_ALIVE = int(os.environ.get("RIGSTACK_TEST_MAX_SERVERS", "1"))
BOOT_TIMEOUT_S = 900.0  # a 2-core CI box shared with other jobs can take minutes to compile


@dataclass
class TestServer:
    __test__ = False  # not a test class, despite the name

    url: str
    run_dir: Path
    log: Path
    stage_s: dict[str, float] = field(default_factory=dict)
    model: str = SERVED_NAME

    def _post(self, path: str, payload: dict[str, Any]) -> dict[str, Any]:
        response = httpx.post(self.url + path, json={"model": self.model, **payload}, timeout=300)
        assert response.status_code == 200, f"{path}: HTTP {response.status_code}: {response.text[:500]}"
        return response.json()

    def completion(self, prompt: str, **params: Any) -> dict[str, Any]:
        return self._post("/v1/completions", {"prompt": prompt, "temperature": 0, **params})

    def chat(self, messages: list[dict[str, Any]], **params: Any) -> dict[str, Any]:
        return self._post("/v1/chat/completions", {"messages": messages, "temperature": 0, **params})


def server_env(work: Path) -> dict[str, str]:
    """Private temp and RPC folders per server, and a small KV cache (the box is shared). The compile cache is the
    pytest worker's (tests/conftest.py sets VLLM_CACHE_ROOT), which its servers share: vLLM keys the graphs by
    config and source; outside that, the server's own."""
    paths = {"TMPDIR": work / "tmp", "VLLM_CACHE_ROOT": Path(os.environ.get("VLLM_CACHE_ROOT", work / "vllm-cache")),
             "VLLM_RPC_BASE_PATH": work / "rpc"}
    for path in paths.values():
        path.mkdir(parents=True, exist_ok=True)
    return {**{key: str(path) for key, path in paths.items()}, "VLLM_CPU_KVCACHE_SPACE": "1"}


@pytest.fixture(scope="session")
def tiny_model() -> Path:
    return build_tiny_model("dense")


@pytest.fixture(scope="session")
def tiny_moe_model() -> Path:
    return build_tiny_model("moe")


@pytest.fixture(scope="session")
def tiny_hybrid_model() -> Path:
    return build_tiny_model("hybrid")


@pytest.fixture(scope="session")
def vllm_server(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Callable[..., TestServer]]:
    alive: dict[tuple[Any, ...], TestServer] = {}

    def factory(model: Path | None = None, extra_args: Sequence[str] = (), env: dict[str, str] | None = None,
                timeout_s: float = BOOT_TIMEOUT_S) -> TestServer:
        key = (str(model or tiny_model), tuple(extra_args), tuple(sorted((env or {}).items())))
        if key in alive:
            if process.running(alive[key].run_dir):
                return alive[key]
            del alive[key]
        while len(alive) >= MAX_ALIVE:
            process.stop(alive.pop(next(iter(alive))).run_dir)
        run_dir = tmp_path_factory.mktemp("server")
        port = free_port()
        argv = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model or tiny_model),
                "--served-model-name", SERVED_NAME, "--host", "127.0.0.1", "--port", str(port),
                "--max-model-len", "2048", *extra_args]
        url = f"http://127.0.0.1:{port}"
        environment = {**server_env(run_dir), **(env or {})}
        launched = ready.launch(argv, environment, run_dir, url=url,
                                served_name=SERVED_NAME, timeout_s=timeout_s)
        alive[key] = TestServer(url=url, run_dir=run_dir, log=Path(launched.record.log), stage_s=launched.stage_s)
        return alive[key]

    yield factory
    for server in alive.values():
        process.stop(server.run_dir)
