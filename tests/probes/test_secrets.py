"""Credentials never reach a result file, a CSV or the terminal, even from a server that echoes them back."""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from testing.probes import last_line, run_script

KEY = "sk-planted-4f9c2e"
USER, PASSWORD = "alice", "pw-planted-7d1b"


def _outputs(process: subprocess.CompletedProcess[str], folder: Path) -> str:
    """Everything the run left for a person to see: stdout, stderr and every file it wrote."""
    return process.stdout + process.stderr + "".join(path.read_text() for path in sorted(folder.glob("*.csv"))
                                                     + sorted(folder.glob("*.json")))


@pytest.mark.parametrize("command, args", [
    (("conc.py",), ("--levels", "1", "--requests", "4", "--warmup", "0", "--fixed", "none")),
    (("probe_bang.py", "run"), ("--repeats", "3", "--max-tokens", "8")),
], ids=["conc", "probe_bang"])
def test_an_echoed_api_key_is_blanked_everywhere(tmp_path: Path, fake_server, command: tuple[str, ...],
                                                 args: tuple[str, ...]) -> None:
    # Two requests answer (their text repeats the header), the rest fail with an error that repeats it.
    url = fake_server("--echo-auth", "--ok", "2")
    env = {**os.environ, "PROBE_KEY": KEY}
    process = run_script(*command, "--url", url, "--model", "fake", "--api-key-env", "PROBE_KEY", *args,
                         "--out", str(tmp_path / "r"), env=env)
    seen = _outputs(process, tmp_path)
    assert "you sent Bearer ***" in seen  # the echo was planted and reached the outputs, blanked
    assert KEY not in seen
    assert (tmp_path / "r.csv").is_file() and "***" in (tmp_path / "r.csv").read_text()
    # owner-only, the files that carry text (issue 39 item 5)
    assert {(tmp_path / name).stat().st_mode & 0o777 for name in ("r.json", "r.csv")} == {0o600}


def test_url_credentials_are_used_and_never_written(tmp_path: Path, fake_server) -> None:
    url = fake_server("--echo-auth", "--ok", "2").replace("http://", f"http://{USER}:{PASSWORD}@")
    process = run_script("conc.py", "--url", url, "--model", "fake", "--levels", "1", "--requests", "4",
                         "--warmup", "0", "--fixed", "none", "--out", str(tmp_path / "r"))
    seen = _outputs(process, tmp_path)
    assert "you sent Basic ***" in seen  # sent as HTTP basic auth, and the echo blanked
    header = base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode()
    for secret in (PASSWORD, f"{USER}:{PASSWORD}", header):
        assert secret not in seen
    provenance = json.loads((tmp_path / "r.json").read_text())["provenance"]
    assert provenance["url"] == url.replace(f"{USER}:{PASSWORD}@", "")
    assert "--url http://***@127.0.0.1:" in " ".join(provenance["argv"])


def test_credentials_stay_out_of_a_connection_error() -> None:
    process = run_script("bench.py", "--url", f"http://{USER}:{PASSWORD}@127.0.0.1:9/v1", "--model", "m")
    assert process.returncode == 1
    assert last_line(process).startswith("error: cannot reach http://127.0.0.1:9: ConnectError")
    assert PASSWORD not in process.stdout + process.stderr


def test_an_echoed_api_key_never_reaches_the_hot_set_file(tmp_path: Path, fake_server) -> None:
    """Issue 39 item 5: the server's count table is written into the hot-set file; an echoed key went with it."""
    url = fake_server("--echo-auth", "--counts")
    out = tmp_path / "hot.json"
    process = run_script("expert_trace.py", "--url", url, "--model", "fake", "--api-key-env", "PROBE_KEY",
                         "--cache", "2", "--out", str(out), env={**os.environ, "PROBE_KEY": KEY})
    assert process.returncode == 0, last_line(process)
    written = out.read_text()
    assert json.loads(written)["model"]["architecture"] == "FakeMoe (you sent Bearer ***)"  # planted, and blanked
    assert KEY not in written + process.stdout + process.stderr  # blanked, it stays readable by the serving user


def test_run_records_and_logs_are_private_and_blank_secret_variables(tmp_path: Path) -> None:
    """Issue 39 item 5: a profile's HF_TOKEN went into server.json, readable by everyone (0644)."""
    from rigstack.serving import process as served
    from rigstack.serving.runrecord import read_record

    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "server.log").write_text("an earlier run's log\n")
    (run_dir / "server.log").chmod(0o644)
    started, record = served.start([sys.executable, "-c", "import time; time.sleep(60)"],
                                   {"HF_TOKEN": "hf_planted_9a8b", "VLLM_CPU_KVCACHE_SPACE": "1"}, run_dir,
                                   url="http://127.0.0.1:9", served_name="m", check_port=False)
    try:
        for name in ("server.json", "server.log"):
            assert (run_dir / name).stat().st_mode & 0o777 == 0o600, name
        assert "hf_planted_9a8b" not in (run_dir / "server.json").read_text()
        assert read_record(run_dir).env == {"HF_TOKEN": "***", "VLLM_CPU_KVCACHE_SPACE": "1"}
    finally:
        served.stop(run_dir)
