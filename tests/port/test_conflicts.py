"""A conflict as the CLI shows it on the real stack against vLLM 0.33.0: stopped, --write refused, --abort."""

from __future__ import annotations

import json
import shutil
from pathlib import Path


from rigstack.versions import REPO_ROOT, load_pins
from testing.cli import one_line_error, run_apply
from testing.port import REAL_NEW


def test_cli_real_stack_stops_at_a_conflict_refuses_write_and_aborts(tmp_path: Path) -> None:
    patches = tmp_path / "patches"
    shutil.copytree(REPO_ROOT / "patches", patches)
    before = {path.name: path.read_bytes() for path in patches.iterdir()}
    pins_before = (REPO_ROOT / "versions.env").read_bytes()
    work = ("--work", str(tmp_path / "build"))
    stopped = run_apply("port", "--to", REAL_NEW, "--patches", str(patches), *work)
    assert stopped.returncode == 1, "the real stack meets conflicts in 0.33.0 (see port-report-0.33.0.json)"
    area = tmp_path / "build" / f"port-{load_pins().vllm_version}-to-{REAL_NEW}"
    state = json.loads((area / "port.json").read_text())
    assert state["status"] == "stopped" and state["conflict_tree"]
    entry = state["patches"][state["next"]]
    assert f"patch {entry['file']} conflicts with vLLM {REAL_NEW}" in one_line_error(stopped)
    assert "python apply.py port --continue" in stopped.stderr and "--skip" in stopped.stderr
    conflicted = area / "vllm" / entry["files"][0]
    assert "<<<<<<< vllm-0.33.0" in conflicted.read_text()
    refused = run_apply("port", "--write", *work)
    assert refused.returncode == 1 and "a conflict is open in" in one_line_error(refused)
    aborted = run_apply("port", "--abort", *work)
    assert aborted.returncode == 0 and not area.exists()
    assert {path.name: path.read_bytes() for path in patches.iterdir()} == before
    assert (REPO_ROOT / "versions.env").read_bytes() == pins_before
