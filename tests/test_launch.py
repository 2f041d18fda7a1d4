"""rigstack.serving and rigstack.launch against real processes: a small HTTP server script that behaves well, dies,
or never gets healthy (no mocks; the vLLM boot itself is covered by test_run_prod_e2e.py)."""

from __future__ import annotations

import io
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from rich.console import Console

from rigstack import launch
from rigstack.serving import events, process, ready, runrecord, unit
from rigstack.errors import UserError
from rigstack.output import launch as launch_output
from testing.mounts import mounted, read_only
from testing.net import free_port

FAKE_SERVER = r'''
import json, os, signal, subprocess, sys, time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

mode, port, name = sys.argv[1], int(sys.argv[2]), sys.argv[3]
if mode == "oom":
    print("loading weights", flush=True)
    time.sleep(0.5)
    print("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB", flush=True)
    sys.exit(1)
if mode == "stubborn":
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
if mode == "slow":  # a boot that says what it is doing before it listens
    print("loading weights: shard 1 of 2", flush=True)
    time.sleep(3)
# A worker in the same process group, as vLLM's engine core and workers are.
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
print(f"child {child.pid}", flush=True)

class Handler(BaseHTTPRequestHandler):
    def log_message(self, *args):
        pass

    def _send(self, code, body):
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        if self.path == "/health":
            self._send(503 if mode == "unhealthy" else 200, {})
        elif self.path == "/v1/models":
            self._send(200, {"data": [{"id": name}]})
        else:
            self._send(404, {})

    def do_POST(self):
        self.rfile.read(int(self.headers["content-length"]))
        self._send(200, {"choices": [{"index": 0, "text": " x", "finish_reason": "length"}],
                         "usage": {"prompt_tokens": 1, "completion_tokens": 1}})

ThreadingHTTPServer(("127.0.0.1", port), Handler).serve_forever()
'''


@pytest.fixture
def fake(tmp_path: Path):
    script = tmp_path / "fake_server.py"
    script.write_text(FAKE_SERVER)
    run_dir = tmp_path / "run"
    started: list[Path] = []

    def start(mode: str, timeout_s: float = 30.0, name: str = "tiny",
              on_event: events.OnEvent = events.quiet) -> ready.Launched:
        port = free_port()
        started.append(run_dir)
        return ready.launch([sys.executable, str(script), mode, str(port), name], {"FAKE": "1"}, run_dir,
                             url=f"http://127.0.0.1:{port}", served_name="tiny", timeout_s=timeout_s,
                             on_event=on_event)

    start.run_dir = run_dir
    yield start
    for folder in started:
        process.stop(folder, grace_s=1)


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"


def _child_pid(run_dir: Path) -> int:
    for line in (run_dir / runrecord.LOG_NAME).read_text().splitlines():
        if line.startswith("child "):
            return int(line.split()[1])
    raise AssertionError("the fake server did not report its child")


def test_launch_passes_every_stage_and_stop_ends_the_group(fake) -> None:
    launched = fake("ok")
    assert list(launched.stage_s) == [stage for stage, _ in ready.STAGES]
    assert launched.record.env == {"FAKE": "1"}
    assert process.running(fake.run_dir) == launched.record
    child = _child_pid(fake.run_dir)

    assert process.stop(fake.run_dir, grace_s=10) is True
    assert _gone(launched.record.pid) and _gone(child)
    assert process.running(fake.run_dir) is None
    assert process.stop(fake.run_dir) is False


def test_a_dying_server_fails_at_once_with_the_log_tail_and_cause(fake) -> None:
    began = time.monotonic()
    with pytest.raises(ready.ServerDied) as caught:
        fake("oom", timeout_s=120)
    assert time.monotonic() - began < 20  # not the timeout
    error = caught.value
    assert error.returncode == 1
    assert "CUDA out of memory" in error.tail
    assert "GPU out of memory" in str(error) and str(error).count("\n") == 0
    assert process.running(fake.run_dir) is None


def test_a_server_that_never_gets_healthy_times_out_and_is_stopped(fake) -> None:
    with pytest.raises(UserError, match=r"did not reach '/health 200' within 3 s") as caught:
        fake("unhealthy", timeout_s=3)
    assert not isinstance(caught.value, ready.ServerDied)
    assert process.running(fake.run_dir) is None


def test_a_server_serving_another_name_never_passes_the_models_stage(fake) -> None:
    with pytest.raises(UserError, match="did not reach '/v1/models lists the model'"):
        fake("ok", timeout_s=3, name="someone-else")


def test_stop_escalates_to_sigkill_when_sigterm_is_ignored(fake) -> None:
    launched = fake("stubborn")
    child = _child_pid(fake.run_dir)
    began = time.monotonic()
    assert process.stop(fake.run_dir, grace_s=1) is True
    assert time.monotonic() - began < 10
    assert _gone(launched.record.pid) and _gone(child)


def test_a_second_launch_into_a_busy_run_dir_is_refused(fake) -> None:
    launched = fake("ok")
    with pytest.raises(UserError) as caught:
        fake("ok")
    assert str(caught.value).startswith(f"already serving tiny at {launched.record.url}, pid {launched.record.pid}; ")
    assert process.running(fake.run_dir) == launched.record  # the refusal stopped nothing


def test_the_boot_shows_the_log_s_last_line_live_and_where_the_log_is(fake, monkeypatch: pytest.MonkeyPatch) -> None:
    screen = io.StringIO()
    monkeypatch.setattr(launch_output, "console", Console(file=screen, force_terminal=True, force_interactive=True,
                                                          width=200, highlight=False, no_color=True))
    launched = fake("slow", on_event=launch_output.LaunchView())
    shown = screen.getvalue()
    assert f"server log: {launched.record.log}" in shown
    assert "loading weights: shard 1 of 2" in shown  # the newest log line, while /health still fails
    assert "ok /health 200" in shown


def test_a_dry_run_command_runs_as_is_in_a_shell(tmp_path: Path) -> None:
    """The printed launch, pasted into bash, runs the same argv with the same env on top of the current one."""
    seen = tmp_path / "seen.json"
    dumper = tmp_path / "dump"
    dumper.write_text(f"#!{sys.executable}\nimport json, os, sys\n"
                      f"open({str(seen)!r}, 'w').write(json.dumps([sys.argv, dict(os.environ)]))\n")
    dumper.chmod(0o755)
    env = {"PLAIN": "1", "SPACED": "a b", "QUOTES": "it's \"x\"", "DOLLAR": "$HOME $(echo no) `id`", "BAR": "0|1",
           "NEWLINE": "one\ntwo"}
    argv = [str(dumper), "-m", "module", "--flag", "a b", "--json", '{"k":"v w"}', "--glob", "*", "--semi", "x;y"]
    text = unit.format_command(argv, env)
    done = subprocess.run(["bash", "-c", text], env={"PATH": os.environ["PATH"], "KEEP": "kept"},
                          capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    got_argv, got_env = json.loads(seen.read_text())
    assert got_argv == argv
    assert {key: got_env.get(key) for key in env} == env and got_env["KEEP"] == "kept"


def test_a_taken_port_is_refused_before_starting(tmp_path: Path) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        port = sock.getsockname()[1]
        with pytest.raises(UserError, match="already answers"):
            ready.launch([sys.executable, "-c", "pass"], {}, tmp_path, url=f"http://127.0.0.1:{port}",
                          served_name="tiny", timeout_s=5)
    assert not (tmp_path / runrecord.RECORD_NAME).exists()


def test_stop_leaves_a_recycled_pid_alone(tmp_path: Path) -> None:
    # A record whose pid now belongs to another process (start time differs) must not be signalled.
    record = runrecord.RunRecord(pid=os.getpid(), pgid=os.getpgid(0), start_ticks=1, argv=["x"], env={},
                              log=str(tmp_path / "log"), url="http://127.0.0.1:1", served_name="tiny")
    runrecord.write_record(tmp_path, record)
    assert process.running(tmp_path) is None
    assert process.stop(tmp_path) is False


@pytest.mark.parametrize("field, value", [("pid", "123"), ("pgid", "123"), ("start_ticks", True), ("argv", "x"),
                                          ("env", {"A": 1})])
def test_a_record_of_the_wrong_types_is_refused_by_name(tmp_path: Path, field: str, value: object) -> None:
    """Issue 39 item 12: a record whose pid or pgid is a numeric string crashed stop (os.kill got text)."""
    record = {"pid": 1 << 22, "pgid": 1 << 22, "start_ticks": 1, "argv": ["x"], "env": {}, "log": "log",
              "url": "http://127.0.0.1:1", "served_name": "tiny", field: value}
    (tmp_path / runrecord.RECORD_NAME).write_text(json.dumps(record))
    with pytest.raises(UserError, match=r"unreadable run record; remove it .* after checking no server"):
        process.stop(tmp_path)


def test_stop_never_signals_its_own_group_or_group_zero(tmp_path: Path) -> None:
    """Issue 39 item 2: a record with pgid 0 made `stop` SIGTERM its own process group (the caller died silently)."""
    for pgid in (0, 1, "own"):
        script = ("import os, sys; from pathlib import Path; from rigstack.serving import process, runrecord\n"
                  "pgid = os.getpgrp() if sys.argv[1] == 'own' else int(sys.argv[1])\n"
                  "runrecord.write_record(Path(sys.argv[2]), runrecord.RunRecord(pid=pgid, pgid=pgid, "
                  "start_ticks=process._start_ticks(pgid) or 0, argv=['x'], env={}, log='log', url='http://x:1', "
                  "served_name='tiny'))\n"
                  "print('stopped' if process.stop(Path(sys.argv[2]), grace_s=1) else 'nothing')\n")
        done = subprocess.run([sys.executable, "-c", script, str(pgid), str(tmp_path)], capture_output=True,
                              text=True, timeout=60, start_new_session=True)
        assert (done.returncode, done.stdout.strip()) == (0, "nothing"), (pgid, done.returncode, done.stderr)


def test_stop_leaves_alone_a_group_whose_recorded_leader_is_gone(tmp_path: Path) -> None:
    """Issue 39 item 2: the recorded leader exited and its pgid now names an unrelated group, which stop signalled."""
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    unrelated = subprocess.Popen(["sleep", "60"], start_new_session=True)
    try:
        for pid in (gone.pid, unrelated.pid):  # a dead leader; a live one that is not the group's recorded leader
            record = runrecord.RunRecord(pid=pid, pgid=unrelated.pid, start_ticks=1, argv=["x"], env={},
                                         log=str(tmp_path / "log"), url="http://127.0.0.1:1", served_name="tiny")
            runrecord.write_record(tmp_path, record)
            assert process.running(tmp_path) is None and process.stop(tmp_path, grace_s=1) is False
            assert unrelated.poll() is None, "the unrelated group was signalled"
    finally:
        unrelated.kill()
        unrelated.wait()


def _running_with(marker: str) -> list[int]:
    pids = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and marker.encode() in (entry / "cmdline").read_bytes():
                pids.append(int(entry.name))
        except OSError:
            pass
    return pids


def test_a_run_record_that_cannot_be_written_leaves_no_server(tmp_path: Path) -> None:
    """Issue 39 item 3: the server started, server.json failed (ENOSPC) and the engine kept running unrecorded."""
    marker = f"rigstack-orphan-{os.getpid()}"
    argv = [sys.executable, "-c", "import time; time.sleep(120)", marker]
    with mounted(tmp_path / "full", "-t", "tmpfs", "-o", "size=1m", "tmpfs") as mount:
        (mount / "run").mkdir()
        (mount / "filler").write_bytes(b"\0" * (shutil.disk_usage(mount).free - 2048))
        with pytest.raises(UserError, match="cannot write the run record in .*run: No space left on device; free "
                                            "space there or pass another --run-dir; the server it started"):
            process.start(argv, {}, mount / "run", url=f"http://127.0.0.1:{free_port()}", served_name="tiny")
        assert _running_with(marker) == []
        with read_only(mount):
            with pytest.raises(UserError, match="Read-only file system.*nothing was started"):
                process.start(argv, {}, mount / "other", url=f"http://127.0.0.1:{free_port()}", served_name="tiny")
        assert _running_with(marker) == []


@pytest.mark.parametrize(("line", "expected"), [
    ("torch.OutOfMemoryError: CUDA out of memory.", "GPU out of memory"),
    ("ValueError: No valid attention backend found for cuda with head_size 576", "attention backend"),
    ("KeyError: 'model.layers.12.self_attn.indexer.weight'", "partition"),
    ("OSError: [Errno 98] Address already in use", "port is taken"),
    ("api_server.py: error: unrecognized arguments: --bogus", "rejected a flag"),
    ("ValueError: To serve at least one request with max seq len (262144), 12 GiB KV cache is needed",
     "KV cache"),
])
def test_likely_cause_names_the_known_failures(line: str, expected: str) -> None:
    assert expected in ready.likely_cause(f"INFO starting\n{line}\n")


def test_likely_cause_ignores_healthy_lines_that_share_words() -> None:
    tail = ("INFO [kv_cache_utils.py] GPU KV cache size: 524,288 tokens\n"
            "INFO loading config.json\nRuntimeError: something nobody has seen before\n")
    assert ready.likely_cause(tail, 1) is None


def test_likely_cause_reads_a_sigkill_as_host_oom() -> None:
    assert "ran out of RAM" in ready.likely_cause("INFO loading", -signal.SIGKILL)
    assert ready.likely_cause("INFO loading", 1) is None


def test_replicas_get_a_folder_port_and_container_each(tmp_path: Path) -> None:
    from rigstack.profiles import load_profile

    profile = load_profile("rtxpro6000-tp2-replicas")
    units = launch.planned_units(profile, None, tmp_path)
    assert len(units) == profile.parallel.replicas > 1
    assert [unit.run_dir for unit in units] == [tmp_path / f"replica-{i}" for i in range(len(units))]
    assert len({unit.url for unit in units}) == len({unit.container for unit in units}) == len(units)
    assert all(unit.argv[:2] == ["docker", "run"] for unit in units)
    (single,) = launch.planned_units(load_profile("cpu-tiny"), None, tmp_path)
    assert single.run_dir == tmp_path and single.container is None and single.env["VLLM_CPU_KVCACHE_SPACE"] == "1"


def test_stop_run_ends_every_replica(tmp_path: Path) -> None:
    script = tmp_path / "fake_server.py"
    script.write_text(FAKE_SERVER)
    records = []
    for replica in range(2):
        port = free_port()
        folder = tmp_path / "run" / f"replica-{replica}"
        records.append(ready.launch([sys.executable, str(script), "ok", str(port), "tiny"], {}, folder,
                                     url=f"http://127.0.0.1:{port}", served_name="tiny", timeout_s=30).record)
    assert launch.stop_run(tmp_path / "run") == 0
    assert all(_gone(record.pid) for record in records)
    with pytest.raises(UserError, match="no running server is recorded"):
        launch.stop_run(tmp_path / "run")
