"""The faulty-card helper: the plan, the verdicts, the dry run, and a live run against a fake faulty card."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from rigstack.errors import UserError
from rigstack.probes.swap import make_plan, verdict
from testing.net import free_port
from testing.probes import FAKE_SERVER, last_line, run_script


def test_plan_orders() -> None:
    plan = make_plan("0,1,2,3", "2,7")
    assert plan.orders == (("baseline", "0,1,2,3"), ("swapped", "0,1,7,3")) and plan.spare
    inside = make_plan("0,1,2,3", "1,3")
    assert inside.orders[1] == ("swapped", "0,3,2,1") and not inside.spare


@pytest.mark.parametrize("devices, swap, message", [
    ("0,1", "1", "give two different devices"), ("0,1", "1,1", "give two different devices"),
    ("0,1,1", "1,2", "lists a device twice"), ("0,1", "5,1", "suspect 5 is not in --devices"),
])
def test_bad_plans(devices: str, swap: str, message: str) -> None:
    with pytest.raises(UserError, match=message):
        make_plan(devices, swap)


@pytest.mark.parametrize("swap, baseline_clean, swapped_clean, start", [
    ("3,9", False, True, "the fault follows card 3"),
    ("3,9", False, False, "the fault does not follow card 3"),
    ("3,1", False, True, "the fault vanished when card 3 and 1 swapped positions"),
    ("3,1", False, False, "the fault stays with card 3 moved to another position"),
    ("3,9", True, True, "no fault in the baseline run"),
])
def test_verdicts(swap: str, baseline_clean: bool, swapped_clean: bool, start: str) -> None:
    assert verdict(make_plan("0,1,2,3", swap), baseline_clean, swapped_clean).startswith(start)


def test_dry_run_prints_both_launches(tmp_path: Path) -> None:
    process = run_script("probe_bang.py", "swap", "--url", "http://127.0.0.1:8000", "--model", "glm", "--devices",
                         "0,1,2,3", "--swap", "2,7", "--serve-cmd", "vllm serve /m --pipeline-parallel-size 4",
                         "--dry-run", cwd=tmp_path)
    assert process.returncode == 0, process.stderr
    text = last_line(process)
    assert "CUDA_VISIBLE_DEVICES=0,1,2,3" in text and "CUDA_VISIBLE_DEVICES=0,1,7,3" in text
    assert "CUDA_DEVICE_ORDER=PCI_BUS_ID" in text and "dry run: nothing started" in text
    assert not list(tmp_path.iterdir())


def test_needs_a_way_to_start(tmp_path: Path) -> None:
    process = run_script("probe_bang.py", "swap", "--url", "http://127.0.0.1:8000", "--model", "glm", "--devices",
                         "0,1", "--swap", "1,2", "--dry-run")
    assert process.returncode == 1 and "--profile NAME or --serve-cmd" in last_line(process)


def test_live_swap_finds_the_faulty_card(tmp_path: Path) -> None:
    """Two real boots of a server process whose card 3 writes token id 0; swapping in spare 9 clears it."""
    port = free_port()
    serve = f"{sys.executable} {FAKE_SERVER} {port} --bad-card 3"
    process = run_script("probe_bang.py", "swap", "--url", f"http://127.0.0.1:{port}", "--model", "fake",
                         "--devices", "0,1,2,3", "--swap", "3,9", "--serve-cmd", serve, "--max-tokens", "8",
                         "--repeats", "2", "--ready-timeout", "60", "--out", str(tmp_path / "s"), cwd=tmp_path)
    assert process.returncode == 0, process.stderr
    assert "verdict: the fault follows card 3: gone once card 3 was replaced by spare 9" in last_line(process)
    assert '"CORRUPTION SUSPECTED"' in (tmp_path / "s-baseline.json").read_text()
    assert "prompt 0 run 0 position 2: token 0, token id 0" in (tmp_path / "s-baseline.json").read_text()
    assert '"clean: all runs identical, nothing flagged"' in (tmp_path / "s-swapped.json").read_text()


def test_dry_run_from_a_profile(tmp_path: Path) -> None:
    """The profile's own server command, rendered and shown with both device orders; nothing built or started."""
    process = run_script("probe_bang.py", "swap", "--url", "http://127.0.0.1:8000", "--model", "tiny", "--devices",
                         "0,1", "--swap", "1,5", "--profile", "cpu-tiny", "--dry-run", cwd=tmp_path)
    assert process.returncode == 0, process.stderr
    text = last_line(process)
    assert text.count("vllm.entrypoints.openai.api_server") == 2 and "--served-model-name tiny" in text
    assert "CUDA_VISIBLE_DEVICES=0,1" in text and "CUDA_VISIBLE_DEVICES=0,5" in text
    assert "dry run: nothing started" in text and not list(tmp_path.iterdir())


def test_a_container_profile_is_refused() -> None:
    process = run_script("probe_bang.py", "swap", "--url", "http://127.0.0.1:8000", "--model", "glm", "--devices",
                         "0,1", "--swap", "1,2", "--profile", "cmp170hx-8x-pp8", "--dry-run")
    assert process.returncode == 1 and "profile cmp170hx-8x-pp8 runs in a container" in last_line(process)
