"""Values from profiles, patches and paths are printed as they are, never read as rich markup: `[/x]` used to raise
MarkupError and `[red]` vanished from a printed path (issue 11, item 14)."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
import typer
from rich.console import Console

from rigstack import cli, output
from rigstack.output import stack as report
from rigstack.applier import StackResult
from rigstack.patchseries import PatchResult
from rigstack.errors import UserError
from rigstack.output.preflight import print_fits, print_report
from rigstack.preflight import runner

TRAP = "/data/[/x]/[red]m"  # a closing tag with no opening one, and a style that would eat itself


@pytest.fixture
def screen(monkeypatch: pytest.MonkeyPatch) -> io.StringIO:
    """Every console of these modules, writing plain text to one buffer."""
    buffer = io.StringIO()
    console = Console(file=buffer, width=400, highlight=False, no_color=True)
    for module, name in ((output, "stdout"), (cli, "console")):
        monkeypatch.setattr(module, name, console)
    return buffer


def test_preflight_prints_profile_values_verbatim(tmp_path: Path, screen: io.StringIO) -> None:
    profile = tmp_path / "trap.yaml"
    profile.write_text(f"extends: cpu-tiny\ndescription: '{TRAP}'\nmodel:\n  path: '{TRAP}'\n  served_name: tiny\n")
    report = runner.preflight(str(profile))
    assert report.code == runner.EXIT_FAIL  # the model folder does not exist
    print_report(report, as_json=False)
    assert f"model folder {TRAP} not found" in screen.getvalue()


def test_the_profile_table_prints_descriptions_verbatim(tmp_path: Path, screen: io.StringIO,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    profile = tmp_path / "trap.yaml"
    profile.write_text(f"extends: cpu-tiny\ndescription: '{TRAP}'\n")
    monkeypatch.setattr(runner, "list_profiles", lambda: [str(profile)])
    print_fits(*runner.fits(), as_json=False)
    assert TRAP in screen.getvalue()


def test_a_user_error_is_printed_verbatim(screen: io.StringIO) -> None:
    app = typer.Typer()

    @app.command()
    def main() -> None:
        raise UserError(f"profile file {TRAP}/p.yaml not found")

    assert cli.run(app, []) == 1
    assert screen.getvalue() == f"error: profile file {TRAP}/p.yaml not found\n"


def test_apply_tables_print_patch_details_verbatim() -> None:
    buffer = io.StringIO()
    console = Console(file=buffer, width=400, highlight=False, no_color=True)
    result = StackResult(package=TRAP, source="dir:" + TRAP, flavour="cpu", fingerprint="sha256:" + "0" * 64,
                         stack_hash="sha256:" + "1" * 64, notes=(f"note {TRAP}",), patches=(
                             PatchResult("0001", f"0001-{TRAP}.patch", "conflict", f"hunk 1: x[i] = {TRAP}"),))
    report.print_stack_result(result, console)
    report.print_status({"package": TRAP, "vllm_version": "0.32.0", "flavour": "cpu", "stack_hash": "s",
                         "stamp_matches_history": False, "stamp_disagrees_on": f"unreadable stamp ({TRAP})",
                         "dirty_files": [f"{TRAP}.py"], "compiled_changed": {f"{TRAP}.so": "changed"},
                         "compiled_checked_against": "the RECORD of x.whl",
                         "patches": [{"file": f"0001-{TRAP}.patch", "status": "applied", "commit": "c" * 40}]},
                        console)
    shown = buffer.getvalue()
    for text in (f"apply: dir:{TRAP} -> {TRAP}", f"0001-{TRAP}.patch", f"hunk 1: x[i] = {TRAP}", f"note {TRAP}",
                 f"{TRAP} (vLLM 0.32.0, cpu)", f"changed outside the stack: {TRAP}.py",
                 f"the git history (unreadable stamp ({TRAP}))", f"not as built: {TRAP}.so (changed)"):
        assert text in shown, text
