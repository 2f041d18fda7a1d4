"""Start a server process from a command given as data, wait for it in stages, and stop it by pid.

API:
    launch(argv, env, run_dir, *, url, served_name, timeout_s, container=None) -> Launched
        Starts argv (env overlaid on os.environ) in its own process group, output to <run_dir>/server.log, records
        <run_dir>/server.json (pid, pgid, start time, argv, url), then waits: process alive -> GET /health 200 ->
        GET /v1/models lists served_name -> a one-token completion. Raises ServerDied (a UserError carrying the
        log tail and a likely cause) the moment the process exits, UserError on timeout; either way what was
        started is stopped first.
    stop(run_dir, grace_s=30) -> bool: SIGTERM to the recorded group, SIGKILL after the grace period; False when
        nothing recorded there is running.
    end(record, grace_s=30) -> bool: the same for a record in hand (what this process itself started).
    running(run_dir) -> RunRecord | None
    serve_profile(profile_name, *, run_dir, model=None, dry_run=False, force=False, on_event) -> int
        (scripts/run_prod.py) load the profile, render it (rigstack.render), refuse when a server of run_dir already
        runs, run preflight (refuse on FAIL unless force), launch, wait. On failure it stops only what it started.
    stop_run(run_dir, on_event) -> int   (`run_prod.py stop`)

Nothing here writes to the terminal: what a person watches (the staged wait, the log tail, a SIGKILL, the dry
run's commands, ready, stopped) is reported as events to the on_event callable the command passes in;
rigstack/output/launch.py renders them. The default, quiet, reports nothing.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import shlex
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

from rigstack import render
from rigstack.atomic import write_atomic
from rigstack.cache import cache_dir
from rigstack.client import Endpoint, Server
from rigstack.errors import UserError
from rigstack.profiles import Profile, load_profile

RECORD_NAME = "server.json"
LOG_NAME = "server.log"
TAIL_LINES = 40
POLL_S = 1.0
PROBE_TIMEOUT_S = 10.0
# The first completion on a busy box can take a while after /health turns 200.
REQUEST_TIMEOUT_S = 120.0
STOP_HINT = "python scripts/run_prod.py stop"

# Signatures of the failures users hit, newest-vLLM wording; first match wins, so specific ones come first.
LIKELY_CAUSES: tuple[tuple[str, str], ...] = (
    (r"CUDA out of memory|torch\.OutOfMemoryError|OutOfMemoryError",
     "GPU out of memory: lower --gpu-memory-utilization, --max-model-len or --max-num-seqs in the profile"),
    (r"No valid attention backend",
     "no attention backend for this GPU and dtype: are the SM8x fallback patches applied? `python apply.py status`"),
    (r"KeyError: '[^']*(weight|bias|scale)[^']*'",
     "a weight name was not found at load: the PP partition starts a stage on the wrong layer; fix `partition:`"),
    (r"[Aa]ddress already in use|Errno 98|port is already allocated",
     f"the port is taken by another process: `{STOP_HINT}` or change `port:`"),
    (r"KV cache|cache blocks|max_model_len.*(larger|greater)|max seq len",
     "no room for the KV cache at this context length: lower --max-model-len / --max-num-seqs or give more memory"),
    (r"unrecognized arguments|invalid choice|argument --",
     "vLLM rejected a flag: run `python preflight.py --profile NAME` (it checks every flag)"),
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
class RunRecord:
    """What launch() started; written to <run_dir>/server.json so a later `stop` finds it."""

    pid: int
    pgid: int
    start_ticks: int  # /proc start time, so a recycled pid is never mistaken for our server
    argv: list[str]
    env: dict[str, str]
    log: str
    url: str
    served_name: str
    container: str | None = None
    started_at: float = field(default_factory=time.time)


@dataclass(frozen=True)
class Launched:
    record: RunRecord
    stage_s: dict[str, float]  # seconds from start until each stage passed


# -- what a launch reports while it runs (rendered by rigstack/output/launch.py) -------------------------------------
@dataclass(frozen=True)
class WaitStarted:
    record: RunRecord


@dataclass(frozen=True)
class Waiting:
    """One poll of the staged wait: the stage not passed yet and the server log's newest line."""

    stage: str
    log_line: str


@dataclass(frozen=True)
class StagePassed:
    stage: str
    after_s: float


@dataclass(frozen=True)
class WaitEnded:
    """The wait is over, passed or not (a live display of it can go)."""

    record: RunRecord


@dataclass(frozen=True)
class Died:
    """The server exited during the wait: the last lines of its log."""

    log: str
    tail: str


@dataclass(frozen=True)
class Killing:
    """The group outlived SIGTERM's grace period and gets SIGKILL."""

    pgid: int
    grace_s: float


@dataclass(frozen=True)
class DryRun:
    """--dry-run: the launch as shell commands, nothing started."""

    commands: str


@dataclass(frozen=True)
class Forced:
    """Preflight failed and --force starts anyway."""


@dataclass(frozen=True)
class Ready:
    url: str
    served_name: str
    record: RunRecord


@dataclass(frozen=True)
class Serving:
    """Everything answers; how to stop it."""

    stop_hint: str


@dataclass(frozen=True)
class Stopped:
    count: int
    run_dir: Path


Event = WaitStarted | Waiting | StagePassed | WaitEnded | Died | Killing | DryRun | Forced | Ready | Serving | Stopped
OnEvent = Callable[[Event], None]


def quiet(event: Event) -> None:
    """The default on_event: library callers and tests that watch nothing."""


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


def log_tail(path: Path, lines: int = TAIL_LINES) -> str:
    if not path.is_file():
        return ""
    with path.open("rb") as log:
        log.seek(0, os.SEEK_END)
        log.seek(max(0, log.tell() - 256 * 1024))
        return "\n".join(log.read().decode(errors="replace").splitlines()[-lines:])


def _read_record(run_dir: Path) -> RunRecord | None:
    path = run_dir / RECORD_NAME
    if not path.is_file():
        return None
    try:
        return RunRecord(**json.loads(path.read_text()))
    except (ValueError, TypeError):
        raise UserError(f"{path}: unreadable run record; remove it (`rm {path}`) after checking no server "
                        "from it still runs") from None


def _write_record(run_dir: Path, record: RunRecord) -> None:
    write_atomic(run_dir / RECORD_NAME, json.dumps(asdict(record), indent=2) + "\n")


def _stat_fields(pid: int) -> list[str] | None:
    """/proc/PID/stat after the parenthesised name (which may hold spaces): [state, ppid, pgrp, ...]."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def _start_ticks(pid: int) -> int | None:
    fields = _stat_fields(pid)
    return int(fields[19]) if fields else None


def _live_members(record: RunRecord) -> list[int]:
    """Live processes of the recorded group; none when the recorded pid now belongs to someone else."""
    ticks = _start_ticks(record.pid)
    if ticks is not None and ticks != record.start_ticks:
        return []
    members = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            fields = _stat_fields(int(entry.name))
            if fields and fields[2] == str(record.pgid) and fields[0] != "Z":
                members.append(int(entry.name))
    return members


def running(run_dir: Path) -> RunRecord | None:
    """The record of a server from run_dir that is still running, else None."""
    record = _read_record(run_dir)
    return record if record is not None and _live_members(record) else None


def port_taken(url: str) -> bool:
    parts = urlsplit(url)
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.settimeout(1.0)
        return sock.connect_ex((parts.hostname or "127.0.0.1", parts.port or 80)) == 0


def refuse_if_serving(run_dir: Path, stop_hint: str) -> None:
    """A run dir holds one server: say which one runs there, and how to stop it, before anything is started."""
    record = running(run_dir)
    if record is not None:
        raise UserError(f"already serving {record.served_name} at {record.url}, pid {record.pid}; "
                        f"`{stop_hint}` first")


def start(argv: Sequence[str], env: dict[str, str], run_dir: Path, *, url: str, served_name: str,
          container: str | None = None, check_port: bool = True) -> tuple[subprocess.Popen[bytes], RunRecord]:
    """Start the process detached in its own session (so stop() can signal the whole group) and record it.
    check_port=False for a process on another host (rigstack.multinode), whose port this host cannot see."""
    refuse_if_serving(run_dir, f"{STOP_HINT} --run-dir {run_dir}")
    if check_port and port_taken(url):
        raise UserError(f"{url} already answers: another server holds the port; stop it or change the port")
    run_dir.mkdir(parents=True, exist_ok=True)
    log_path = run_dir / LOG_NAME
    with log_path.open("wb") as log:
        try:
            process = subprocess.Popen(list(argv), env={**os.environ, **env}, stdin=subprocess.DEVNULL,
                                       stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        except OSError as error:
            raise UserError(f"cannot start {argv[0]}: {error.strerror}; check the interpreter or docker path") \
                from None
    record = RunRecord(pid=process.pid, pgid=process.pid, start_ticks=_start_ticks(process.pid) or 0,
                       argv=list(argv), env=dict(env), log=str(log_path), url=url, served_name=served_name,
                       container=container)
    _write_record(run_dir, record)
    return process, record


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
               on_event: OnEvent = quiet) -> dict[str, float]:
    """Walk the stages in order; returns seconds since start at which each passed. Every poll is reported, with
    the log's newest line: a boot takes minutes, and the log says what it is doing (loading shard 12 of 40)."""
    server = Server(Endpoint(record.url, record.served_name), timeout_s=REQUEST_TIMEOUT_S)
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
           timeout_s: float, container: str | None = None, on_event: OnEvent = quiet) -> Launched:
    """Start the server and wait until it answers a completion; on any failure stop it before raising."""
    process, record = start(argv, env, run_dir, url=url, served_name=served_name, container=container)
    try:
        stage_s = wait_ready(process, record, timeout_s, on_event)
    except BaseException as error:
        end(record, on_event=on_event)
        process.wait()
        if isinstance(error, ServerDied):
            on_event(Died(record.log, error.tail))
        raise
    return Launched(record, stage_s)


# -- stopping ----------------------------------------------------------------------------------------------------
def _signal_group(record: RunRecord, sig: signal.Signals) -> None:
    try:
        os.killpg(record.pgid, sig)
    except ProcessLookupError:
        pass


def _reap(pid: int) -> None:
    """Collect the leader when this process is its parent (tests), so it does not linger as a zombie."""
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        pass


def _group_gone(record: RunRecord) -> bool:
    _reap(record.pid)
    return not _live_members(record)


def _wait_gone(record: RunRecord, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if _group_gone(record):
            return True
        time.sleep(0.2)
    return _group_gone(record)


def stop(run_dir: Path, grace_s: float = 30.0, on_event: OnEvent = quiet) -> bool:
    """End what launch() started in run_dir: SIGTERM to its group, SIGKILL after grace_s."""
    record = running(run_dir)
    return record is not None and end(record, grace_s, on_event)


def end(record: RunRecord, grace_s: float = 30.0, on_event: OnEvent = quiet) -> bool:
    """End one recorded server. Only its group is signalled, and only while its leader is the recorded process
    (or the group still exists); False when nothing of it runs."""
    if not _live_members(record):
        return False
    _signal_group(record, signal.SIGTERM)
    if not _wait_gone(record, grace_s):
        on_event(Killing(record.pgid, grace_s))
        _signal_group(record, signal.SIGKILL)
        _wait_gone(record, 10.0)
    if record.container:
        # `docker run` forwards SIGTERM to the container, but a SIGKILLed client leaves it running.
        from rigstack import dockerapi  # only container runs need the docker SDK

        dockerapi.remove_container(record.container)
    return True


# -- a profile, end to end (scripts/run_prod.py) -----------------------------------------------------------------
DEFAULT_RUN_DIR = cache_dir() / "run"


def _probe_url(host: str, port: int) -> str:
    # A server bound to all interfaces is reached through loopback.
    return f"http://{'127.0.0.1' if host in ('0.0.0.0', '::', '') else host}:{port}"


@dataclass(frozen=True)
class Unit:
    """One server process of a profile: the only one, or one replica (seed 004's TP2 units)."""

    run_dir: Path
    argv: list[str]
    env: dict[str, str]
    url: str
    container: str | None = None


def planned_units(profile: Profile, model: Path | None, run_dir: Path) -> list[Unit]:
    """`docker run` when the profile names an image, else the server on this host; replicas get run_dir/replica-N."""
    units = []
    for replica in range(profile.parallel.replicas):
        folder = run_dir if profile.parallel.replicas == 1 else run_dir / f"replica-{replica}"
        url = _probe_url(profile.host, profile.port + replica)
        if profile.image:
            container = f"rigstack-{profile.name}-{replica}"
            argv = render.docker_run(profile, model=model, replica=replica, name=container)
            units.append(Unit(folder, argv, {}, url, container))
        else:
            command = render.serve_command(profile, model=model, replica=replica)
            units.append(Unit(folder, command.argv, command.env, url))
    return units


def format_command(argv: Sequence[str], env: dict[str, str]) -> str:
    """The launch as one shell command that runs as is when pasted: `env K=V ... program args`, the env overlaid
    on the current one as the launcher does, every word shell-quoted, one option per continued line."""
    command: list[list[str]] = []
    for arg in argv:
        # The program and its first words share a line; then one line per option and its values.
        if not command or arg.startswith("-"):
            command.append([])
        command[-1].append(arg)
    prefix = [["env", *(f"{key}={value}" for key, value in env.items())]] if env else []
    return " \\\n  ".join(" ".join(map(shlex.quote, group)) for group in [*prefix, *command])


def serve_profile(profile_name: str, *, run_dir: Path = DEFAULT_RUN_DIR, model: Path | None = None,
                  dry_run: bool = False, force: bool = False, on_event: OnEvent = quiet) -> int:
    """Preflight, then start the profile's server(s) and wait for each; they keep running after this returns.
    Replicas start one after another, each once the one before answers (they must not load at the same time)."""
    from rigstack.preflight.runner import EXIT_FAIL, run_preflight
    from rigstack.replicas import with_router

    profile = load_profile(profile_name)
    if profile.hosts:
        from rigstack.multinode import serve_hosts  # one engine across hosts on Ray

        return serve_hosts(profile_name, run_dir=run_dir, model=model, dry_run=dry_run, on_event=on_event)
    units = with_router(profile, planned_units(profile, model, run_dir), run_dir)
    if dry_run:
        on_event(DryRun("\n\n".join(format_command(unit.argv, unit.env) for unit in units)))
        return 0
    stop_hint = STOP_HINT + ("" if run_dir == DEFAULT_RUN_DIR else f" --run-dir {run_dir}")
    for unit in units:
        refuse_if_serving(unit.run_dir, stop_hint)
    if run_preflight(profile_name, model=model) == EXIT_FAIL:
        if not force:
            raise UserError(f"preflight failed for profile {profile.name} (FAIL lines above); fix them, or "
                            f"`python scripts/run_prod.py --profile {profile_name} --force` to start anyway",
                            exit_code=EXIT_FAIL)
        on_event(Forced())
    started: list[RunRecord] = []
    try:
        for unit in units:
            launched = launch(unit.argv, unit.env, unit.run_dir, url=unit.url, served_name=profile.model.served_name,
                              timeout_s=profile.health_timeout_s, container=unit.container, on_event=on_event)
            started.append(launched.record)
            on_event(Ready(unit.url, profile.model.served_name, launched.record))
    except BaseException:
        for record in started:  # a half-started set of replicas is no use; what others started is not ours
            end(record, on_event=on_event)
        raise
    on_event(Serving(stop_hint))
    return 0


def stop_all(run_dir: Path, on_event: OnEvent = quiet) -> int:
    """Stop the router, the server recorded in run_dir and those in its replica-N folders; how many were running.
    The router goes first, so that no request is sent to a replica being stopped."""
    from rigstack.replicas import ROUTER_DIR

    folders = [run_dir / ROUTER_DIR, run_dir, *sorted(run_dir.glob("replica-*")), *sorted(run_dir.glob("ray-*"))]
    return sum(stop(folder, on_event=on_event) for folder in folders)


def stop_run(run_dir: Path = DEFAULT_RUN_DIR, on_event: OnEvent = quiet) -> int:
    stopped = stop_all(run_dir, on_event)
    if stopped:
        on_event(Stopped(stopped, run_dir))
        return 0
    raise UserError(f"no running server is recorded in {run_dir}; pass the --run-dir it was started with")
