"""apply.py port's command line: bad input as one line, JSON in every outcome."""

from __future__ import annotations

import json
from pathlib import Path


from packaging.version import Version

from rigstack.versions import load_pins, update_pins
from rigstack.wheelindex import newest_release
from testing.cli import one_line_error, run_apply
from testing.patches import PatchMaker
from testing.port import REAL_NEW, Pair


def test_cli_bad_input_is_one_line(tmp_path: Path) -> None:
    work = ("--work", str(tmp_path / "build"))
    result = run_apply("port", "--continue", *work)
    assert result.returncode == 1 and "no port in progress" in one_line_error(result)
    result = run_apply("port", "--write", *work)
    assert result.returncode == 1 and "no port in progress" in one_line_error(result)
    result = run_apply("port", "--continue", "--skip", *work)
    assert result.returncode == 1 and "do not go together" in one_line_error(result)
    result = run_apply("port", "--to", "99.0.0", *work)
    assert result.returncode == 1
    assert "the package index has no vllm 99.0.0 wheel that installs on this machine" in one_line_error(result)
    assert not (tmp_path / "build").exists() or not any((tmp_path / "build").iterdir())


def test_cli_json_in_every_outcome(patch_maker: PatchMaker, tmp_path: Path) -> None:
    """Issue 11 item 27: a stack that fails on its own pin printed no JSON (and advised `apply.py port` to port)."""
    folder = tmp_path / "patches"
    logger = patch_maker.read("logger.py")
    patch_maker.write(folder, "0001-stale.patch", {"logger.py": logger.replace("import ", "# new\nimport ", 1)},
                      on_top_of={"logger.py": logger.replace("import ", "# old\nimport ", 1)})
    work = tmp_path / "build"
    result = run_apply("port", "--to", REAL_NEW, "--patches", str(folder), "--json", "--work", str(work))
    assert result.returncode == 1
    report = json.loads(result.stdout)
    pinned = load_pins().vllm_version
    assert report["status"] == "failed" and report["error"] in one_line_error(result)
    assert report["error"].startswith(f"the stack does not apply to its own baseline vLLM {pinned}, so it cannot be "
                                      "ported: patch 0001-stale.patch: hunk 1 of vllm/logger.py")
    assert "apply.py port" not in report["error"] and "Refresh the patch against the pinned vLLM" in report["error"]
    assert [(p["id"], p["status"]) for p in report["old_stack"]["patches"]] == [("0001", "conflict")]
    assert "0001-stale.patch" in result.stderr and "conflict" in result.stderr, "the table goes to stderr"
    assert not work.exists() or not any(work.iterdir()), "nothing is kept"
    refused = run_apply("port", "--continue", "--json", "--work", str(work))
    assert refused.returncode == 1
    assert json.loads(refused.stdout) == {"work": None, "error": one_line_error(refused).removeprefix("error: "),
                                          "next_steps": [], "message": "", "status": "failed"}


def test_to_latest_asks_the_index_for_the_newest_release(tmp_path: Path) -> None:
    """Issue 36 item 6: `port --to latest --report-only` reports the stack against the newest vLLM on the index."""
    result = run_apply("port", "--to", "latest", "--report-only", "--json", "--work", str(tmp_path))
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    pinned = load_pins().vllm_version
    if report["status"] == "up-to-date":
        assert f"vLLM {pinned} is the newest release" in report["message"]
    else:
        assert Version(report["new"]["version"]) > Version(pinned) and report["patches"]


def test_to_latest_when_the_pin_is_the_newest_says_so(pair: Pair) -> None:
    newest = newest_release("vllm")
    update_pins({"VLLM_VERSION": newest}, pair.versions)
    report = pair.run("report-only", to="latest")
    assert report.error is None and report.to_json()["status"] == "up-to-date"
    assert report.message.startswith(f"vLLM {newest} is the newest release")
