"""Wait for a started server in stages, and launch = start + wait, stopping what was started when the wait fails.

API:
    launch(argv, env, run_dir, *, url, served_name, timeout_s, container=None, on_event) -> Launched
        Starts argv (rigstack.serving.process.start), then waits: process alive -> GET /health 200 ->
        GET /v1/models lists served_name -> a one-token completion. Raises ServerDied (a UserError carrying the
        log tail and a likely cause) the moment the process exits, UserError on timeout; either way what was
        started is stopped first.
    launch_units(units, served_name, timeout_s, started, on_event) -> None: units one after another, each once the
        one before answers (a profile's replicas and router, rigstack.launch; a fleet's pools, rigstack.fleetlaunch).
"""

from __future__ import annotations

import asyncio
import re
import signal
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from rigstack.client import Server
from rigstack.endpoint import Endpoint
from rigstack.errors import UserError
from rigstack.invocation import command
from rigstack.serving.events import Died, OnEvent, Ready, StagePassed, WaitEnded, WaitStarted, Waiting, quiet
from rigstack.serving.process import STOP_HINT, end, start
from rigstack.serving.runrecord import RunRecord, log_tail
from rigstack.serving.unit import Unit

POLL_S = 1.0
PROBE_TIMEOUT_S = 10.0
# The first completion on a busy box can take a while after /health turns 200.
REQUEST_TIMEOUT_S = 120.0

# Signatures of the failures users hit, newest-vLLM wording; first match wins, so specific ones come first.
LIKELY_CAUSES: tuple[tuple[str, str], ...] = (
    (r"CUDA out of memory|torch\.OutOfMemoryError|OutOfMemoryError",
     "GPU out of memory: lower --gpu-memory-utilization, --max-model-len or --max-num-seqs in the profile"),
    (r"No valid attention backend",
     f"no attention backend for this GPU and dtype: are the SM8x fallback patches applied? `{command('status')}`"),
    (r"KeyError: '[^']*(weight|bias|scale)[^']*'",
     "a weight name was not found at load: the PP partition starts a stage on the wrong layer; fix `partition:`"),
    (r"ipc path .* is longer than \d+ characters",
     "the engine's socket path is too long for a Unix socket: set VLLM_RPC_BASE_PATH (or TMPDIR) to a short folder"),
    (r"[Aa]ddress already in use|Errno 98|port is already allocated",
     f"the port is taken by another process: `{STOP_HINT}` or change `port:`"),
    (r"KV cache|cache blocks|max_model_len.*(larger|greater)|max seq len",
     "no room for the KV cache at this context length: lower --max-model-len / --max-num-seqs or give more memory"),
    (r"unrecognized arguments|invalid choice|argument --",
     f"vLLM rejected a flag: run `{command('preflight --profile NAME')}` (it checks every flag)"),
    (r"No module named|ImportError|ModuleNotFoundError",
     "an import failed: the (patched) vllm package is incomplete or not on the path; run preflight"),
    (r"NCCL error|ncclSystemError|ncclUnhandledCudaError",
     "NCCL failed: on cards without P2P set NCCL_P2P_DISABLE=1 in the profile's env"),
    (r"illegal memory access|Xid|device-side assert",
     "a GPU fault: rerun with CUDA_LAUNCH_BLOCKING=1 and check `dmesg` for Xid errors"),
    (r"config\.json|is not a local folder|Repository Not Found|HFValidationError",
     "the model folder is missing or incomplete: check the profile's model path (or pass --model)"),
)


@dataclass(frozen=True)
class Launched:
    record: RunRecord
    stage_s: dict[str, float]  # seconds from start until each stage passed


class ServerDied(UserError):
    """The server exited while we waited; the message is one line, the tail and cause ride along."""

    def __init__(self, message: str, tail: str, cause: str | None, returncode: int | None) -> None:
        super().__init__(message)
        self.tail = tail
        self.cause = cause
        self.returncode = returncode


# Only error lines are read: healthy INFO lines also say "KV cache" or "config.json".
_ERROR_LINE = re.compile(r"error|exception|traceback|fatal", re.IGNORECASE)


def likely_cause(log_tail: str, returncode: int | None = None) -> str | None:
    errors = "\n".join(line for line in log_tail.splitlines() if _ERROR_LINE.search(line))
    for pattern, cause in LIKELY_CAUSES:
        if re.search(pattern, errors):
            return cause
    if returncode == -signal.SIGKILL:
        return "killed by SIGKILL: probably the host ran out of RAM (check `dmesg | grep -i oom`)"
    return None


# -- the staged wait ---------------------------------------------------------------------------------------------
def _lists_model(server: Server) -> bool:
    try:
        return any(card.get("id") == server.endpoint.model for card in server.models())
    except UserError:
        return False


def _one_token(server: Server) -> bool:
    async def send() -> bool:
        async with server.session(1) as session:
            reply = await server.request(session, "/v1/completions",
                                         {"prompt": "Hello", "max_tokens": 1, "temperature": 0})
            return reply.ok and reply.tokens == 1
    return asyncio.run(send())


STAGES: tuple[tuple[str, Callable[[Server], bool]], ...] = (
    ("process alive", lambda server: True),
    ("/health 200", lambda server: server.health(PROBE_TIMEOUT_S)),
    ("/v1/models lists the model", _lists_model),
    ("one-token completion", _one_token),
)


def _died(process: subprocess.Popen[bytes], record: RunRecord, stage: str) -> ServerDied:
    tail = log_tail(Path(record.log))
    cause = likely_cause(tail, process.returncode)
    return ServerDied(f"the server exited (code {process.returncode}) while waiting for {stage}: "
                      f"{cause or 'no known cause in the log'}; full log: {record.log}",
                      tail, cause, process.returncode)


def wait_ready(process: subprocess.Popen[bytes], record: RunRecord, timeout_s: float,
               on_event: OnEvent = quiet, api_key: str | None = None) -> dict[str, float]:
    """Walk the stages in order; returns seconds since start at which each passed. Every poll is reported, with
    the log's newest line: a boot takes minutes, and the log says what it is doing (loading shard 12 of 40).
    api_key: the bearer key a server that demands one (a keyed gateway) is probed with."""
    server = Server(Endpoint(record.url, record.served_name, api_key), timeout_s=REQUEST_TIMEOUT_S)
    began = time.monotonic()
    passed: dict[str, float] = {}
    on_event(WaitStarted(record))
    try:
        for stage, probe in STAGES:
            while True:
                if process.poll() is not None:
                    raise _died(process, record, stage)
                on_event(Waiting(stage, log_tail(Path(record.log), 1)))
                if probe(server):
                    break
                if time.monotonic() - began > timeout_s:
                    raise UserError(f"the server did not reach '{stage}' within {timeout_s:.0f} s and was stopped "
                                    f"(log: {record.log}); raise health_timeout_s in the profile if it was still "
                                    "loading")
                time.sleep(POLL_S)
            passed[stage] = round(time.monotonic() - began, 2)
            on_event(StagePassed(stage, passed[stage]))
    finally:
        on_event(WaitEnded(record))
    return passed


def launch(argv: Sequence[str], env: dict[str, str], run_dir: Path, *, url: str, served_name: str,
           timeout_s: float, container: str | None = None, on_event: OnEvent = quiet,
           profile: str | None = None, api_key: str | None = None) -> Launched:
    """Start the server and wait until it answers a completion (probed with api_key, when it demands one); on any
    failure stop it before raising."""
    process, record = start(argv, env, run_dir, url=url, served_name=served_name, container=container,
                            profile=profile)
    try:
        stage_s = wait_ready(process, record, timeout_s, on_event, api_key)
    except BaseException as error:
        end(record, on_event=on_event)
        process.wait()
        if isinstance(error, ServerDied):
            on_event(Died(record.log, error.tail))
        raise
    return Launched(record, stage_s)


def launch_units(units: list[Unit], served_name: str, timeout_s: float, started: list[RunRecord],
                 on_event: OnEvent = quiet) -> None:
    """Start the units one after another, each once the one before answers a completion for served_name. Each
    record is appended to `started` as it starts, so that the caller can end them all when a later one fails."""
    for unit in units:
        launched = launch(unit.argv, unit.env, unit.run_dir, url=unit.url, served_name=served_name,
                          timeout_s=timeout_s, container=unit.container, on_event=on_event, profile=unit.profile)
        started.append(launched.record)
        on_event(Ready(unit.url, served_name, launched.record))
