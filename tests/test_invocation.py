"""Issue 29 item 9: errors and hints name a command the way the user ran this process (rigstack.invocation)."""

from __future__ import annotations

import sys

import pytest

from rigstack import cli, invocation, main


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
