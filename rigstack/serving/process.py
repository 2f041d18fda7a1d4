"""A server process started from a command given as data, in its own process group, recorded in its run folder, and
stopped by that record: SIGTERM to the group, SIGKILL after a grace period.

API:
    start(argv, env, run_dir, *, url, served_name, container=None, check_port=True) -> (Popen, RunRecord)
        argv (env overlaid on os.environ) in its own session, output to <run_dir>/server.log, recorded in
        <run_dir>/server.json (pid, pgid, start time, argv, url).
    running(run_dir) -> RunRecord | None; refuse_if_serving(run_dir, stop_hint); port_taken(url) -> bool
    stop(run_dir, grace_s=30) -> bool: False when nothing recorded there is running.
    end(record, grace_s=30) -> bool: the same for a record in hand (what this process itself started).
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path
from urllib.parse import urlsplit

from rigstack.errors import UserError
from rigstack.invocation import command
from rigstack.serving.events import Killing, OnEvent, quiet
from rigstack.serving.runrecord import LOG_NAME, RunRecord, read_record, write_record

STOP_HINT = command("stop")


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
    """Live processes of the recorded group while its leader is still the recorded process (pid and start time);
    none otherwise. start() makes the server a group leader (pid == pgid); a record that says otherwise, or names
    group 0, 1 or this process's own, was not written by it and is never signalled."""
    if record.pid != record.pgid or record.pgid <= 1 or record.pgid == os.getpgrp():
        return []
    if _start_ticks(record.pid) != record.start_ticks:
        return []  # the leader is gone, or its pid now belongs to another process
    members = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            fields = _stat_fields(int(entry.name))
            if fields and fields[2] == str(record.pgid) and fields[0] != "Z":
                members.append(int(entry.name))
    return members


def running(run_dir: Path) -> RunRecord | None:
    """The record of a server from run_dir that is still running, else None."""
    record = read_record(run_dir)
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
          container: str | None = None, check_port: bool = True,
          profile: str | None = None) -> tuple[subprocess.Popen[bytes], RunRecord]:
    """Start the process detached in its own session (so stop() can signal the whole group) and record it.
    check_port=False for a process on another host (rigstack.multinode), whose port this host cannot see."""
    refuse_if_serving(run_dir, f"{STOP_HINT} --run-dir {run_dir}")
    if check_port and port_taken(url):
        raise UserError(f"{url} already answers: another server holds the port; stop it or change the port")
    log_path = run_dir / LOG_NAME
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        # Owner-only, as the record: an engine logs its arguments and a failing one its environment.
        log = open(os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "wb")
        os.chmod(log_path, 0o600)  # a log left by an earlier run keeps its old mode through O_CREAT
    except OSError as error:
        raise _unwritable(run_dir, error, "nothing was started") from None
    with log:
        try:
            process = subprocess.Popen(list(argv), env={**os.environ, **env}, stdin=subprocess.DEVNULL,
                                       stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        except OSError as error:
            raise UserError(f"cannot start {argv[0]}: {error.strerror}; check the interpreter or docker path") \
                from None
    record = RunRecord(pid=process.pid, pgid=process.pid, start_ticks=_start_ticks(process.pid) or 0,
                       argv=list(argv), env=dict(env), log=str(log_path), url=url, served_name=served_name,
                       container=container, profile=profile)
    try:
        write_record(run_dir, record)
    except OSError as error:
        # Unrecorded, `stop` could never find it: it would hold the port (on a rig, the GPUs) until found by hand.
        _signal_group(record, signal.SIGKILL)
        process.wait()
        raise _unwritable(run_dir, error, f"the server it started (pid {process.pid}) was stopped") from None
    return process, record


def _unwritable(run_dir: Path, error: OSError, outcome: str) -> UserError:
    return UserError(f"cannot write the run record in {run_dir}: {error.strerror}; free space there or pass "
                     f"another --run-dir; {outcome}")


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
    """End one recorded server. Only its group is signalled, and only while its leader is the recorded process;
    False when nothing of it runs."""
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
