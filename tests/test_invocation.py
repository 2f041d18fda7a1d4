"""Issue 29 item 9: errors and hints name a command the way the user ran this process (rigstack.invocation)."""

from __future__ import annotations

import json
import sys

import pytest

from rigstack import cli, invocation, main
from rigstack.versions import REPO_ROOT


@pytest.mark.parametrize(("argv0", "expected"), [
    ("/x/.venv/bin/rigstack", "`rigstack preflight profiles`"),
    ("preflight.py", "`python preflight.py profiles`"),
    ("scripts/run_prod.py", "`python preflight.py profiles`"),
])
def test_an_unknown_profile_file_names_the_list_command_as_run(argv0: str, expected: str,
                                                              monkeypatch: pytest.MonkeyPatch,
                                                              capsys: pytest.CaptureFixture) -> None:
    monkeypatch.setattr(sys, "argv", [argv0])
    assert cli.run(main.app, ["serve", "--profile", "nope.yaml", "--dry-run"]) == 1
    assert capsys.readouterr().err.strip() == f"error: profile file nope.yaml not found; {expected} lists profiles"


def test_each_subcommand_is_its_entry_point_and_a_rerun_keeps_the_form(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "argv", ["apply.py"])
    shims = {"port --skip": "python apply.py port --skip", "stop": "python scripts/run_prod.py stop",
             "serve --profile X": "python scripts/run_prod.py --profile X", "plan": "python preflight.py plan",
             "image verify REF": "python -m rigstack.images verify-image REF",
             "bang run": "python scripts/probe_bang.py run", "bench --url U": "python scripts/bench.py --url U",
             "status PKG": "python apply.py status PKG"}
    assert {words: invocation.command(words) for words in shims} == shims
    monkeypatch.setenv(invocation.ENV, "rigstack")  # a rerun of `rigstack serve` in the serving interpreter
    assert invocation.command("stop") == "rigstack stop"
    monkeypatch.setattr(sys, "argv", ["/x/bin/rigstack"])
    monkeypatch.delenv(invocation.ENV)
    assert invocation.rerun_env() == {invocation.ENV: "rigstack"}


def test_a_command_run_inside_another_checkout_is_refused_naming_both(tmp_path, monkeypatch: pytest.MonkeyPatch,
                                                                    capsys: pytest.CaptureFixture) -> None:
    """Issue 39 item 8: the tool venv's rigstack (an editable install of one checkout), run inside a second clone,
    read and would have written the first one's patches/ and versions.env."""
    other = tmp_path / "clone"
    (other / "rigstack").mkdir(parents=True)
    for mark in ("versions.env", "apply.py", "rigstack/__init__.py"):
        (other / mark).touch()
    (other / "patches").mkdir()
    monkeypatch.setattr(sys, "argv", ["/x/.venv/bin/rigstack"])
    monkeypatch.chdir(other / "patches")
    assert cli.run(main.app, ["port", "--to", "0.34.0", "--report-only"]) == 1
    error = capsys.readouterr().err.strip()
    assert error.startswith(f"error: this rigstack acts on the checkout at {REPO_ROOT}, but you are inside another "
                            f"one, {other}; run that checkout's own") and "\n" not in error
    monkeypatch.chdir(tmp_path)  # outside any checkout: runs as before
    assert cli.run(main.app, ["serve", "--profile", "nope.yaml", "--dry-run"]) == 1
    assert "profile file nope.yaml not found" in capsys.readouterr().err


@pytest.mark.parametrize("argv", [["preflight", "--profile", "nope", "--json"],
                                  ["plan", "--profile", "nope", "--json"], ["status", "--json", "/nonexistent/vllm"]])
def test_a_failed_json_command_says_so_on_stdout_too(argv: list[str], capsys: pytest.CaptureFixture) -> None:
    """Issue 39: `preflight --json` that failed printed nothing on stdout, where the script reading it looks."""
    code = cli.run(main.app, argv)
    out, err = capsys.readouterr()
    assert code != 0 and json.loads(out) == {"error": err.strip().removeprefix("error: "), "exit_code": code}
