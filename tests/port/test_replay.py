"""port's replay of a whole stack, --report-only: a status for every patch, the synthetic pair and the real stack
against vLLM 0.33.0."""

from __future__ import annotations

import json
import os

import pytest
from rich.console import Console

from rigstack.baseline import sha256_of
from rigstack.output.port import print_report
from rigstack.port import PortReport, PortState
from rigstack.stack import load_stack
from rigstack.versions import REPO_ROOT
from testing.cli import run_apply
from testing.port import REAL_NEW, Pair
from testing.port import statuses as _statuses


def test_report_only_walks_the_whole_stack(pair: Pair) -> None:
    report = pair.run("report-only")
    assert _statuses(report) == ["clean", "moved", "upstreamed", "conflict", "clean"]
    helper, cli, _, parser, _ = report.state.patches
    assert helper.drift == ["vllm/sched.py: helper"], "the patch sits in a function upstream changed"
    assert cli.moved == {"launchers/cli_args.py": "common/cli_args.py"} and cli.files == ["common/cli_args.py"]
    assert parser.conflicts[0].file == "vllm/parser.py" and parser.conflicts[0].hunk.startswith("hunk 1 ")
    assert report.state.new.sha256 == sha256_of(pair.new_wheel)
    assert report.state.cpu["status"] == "applies"
    assert not pair.work.exists() or not any(pair.work.iterdir()), "report-only keeps nothing"


def test_a_patch_on_a_file_an_earlier_conflict_creates_waits_on_it(pair: Pair) -> None:
    """Issue 36 item 4a: 0012 edits stage_timing.py, which 0003 creates; while 0003 conflicts, git says the file was
    "deleted in vllm-0.34.0". The report names the earlier patch instead, and a real conflict beside it stays one."""
    maker = pair.maker
    parser = maker.edit("parser.py", "    value = raw.strip()\n",
                        "    value = raw.strip()\n    value = None if value == 'null' else value\n")  # 0004's
    creator = {"parser.py": parser["parser.py"].replace("'null'", "'nil'"), "hooks.py": "HOOK = 1\n"}
    maker.write(pair.patches, "0006-parser-hooks.patch", creator, on_top_of=parser)
    maker.write(pair.patches, "0007-hooks-only.patch", {"hooks.py": "HOOK = 2\n"}, on_top_of={**parser, **creator})
    after = {**parser, **creator, "hooks.py": "HOOK = 2\n"}
    maker.write(pair.patches, "0008-hooks-and-parser.patch", {"hooks.py": "HOOK = 3\n", "parser.py":
                creator["parser.py"].replace("'nil'", "'none'")}, on_top_of=after)
    report = pair.run("report-only")
    creator_entry, waiting, mixed = report.state.patches[5:]
    assert creator_entry.status == "conflict"
    assert waiting.status == "waiting" and waiting.conflicts == []
    assert waiting.detail == "waits on 0006 (conflict), which creates vllm/hooks.py"
    assert "deleted" not in waiting.detail
    assert mixed.status == "conflict" and mixed.detail.startswith("waits on 0006 (conflict), which creates")
    assert [site.file for site in mixed.conflicts] == ["vllm/parser.py"]


@pytest.mark.slow
def test_the_real_stack_ports_to_0_33_0_report_only() -> None:
    """CI keeps build/port-report-0.33.0.json as an artifact: the state of the real stack against 0.33.0."""
    artifact = REPO_ROOT / "build" / f"port-report-{REAL_NEW}.json"
    result = run_apply("port", "--to", REAL_NEW, "--report-only", "--json")
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    artifact.parent.mkdir(exist_ok=True)
    artifact.write_text(json.dumps(report, indent=2, sort_keys=True) + "\n")
    assert [p["id"] for p in report["patches"]] == list(load_stack().ids)
    assert all(p["status"] in ("clean", "refreshed", "moved", "upstreamed", "conflict", "waiting")
               for p in report["patches"])
    for entry in report["patches"]:
        if entry["status"] == "conflict":
            assert entry["conflicts"] and all(site["file"].startswith("vllm/") for site in entry["conflicts"])
    assert report["cpu"]["status"] == "no-release" and report["error"] is None
    _every_file_name_shown_at_80_columns(report)


def _every_file_name_shown_at_80_columns(report: dict) -> None:
    """Issue 29 item 11: on an 80-column terminal the table folds a long name over lines; it never cuts it (before,
    `vllm/v1/core/sched…`). Each column's pieces, read down the table, hold every conflict's and drift's file."""
    console = Console(width=80, record=True, file=open(os.devnull, "w"))  # noqa: SIM115 - closed with the console
    print_report(PortReport(None, PortState.model_validate(report)), console)
    lines = [line for line in console.export_text().splitlines() if line.startswith("│")]
    columns = ["".join(cells).replace(" ", "") for cells in zip(*(line.split("│")[1:-1] for line in lines))]
    names = {site["file"] for entry in report["patches"] for site in entry["conflicts"]} | {
        line.split(": ")[0] for entry in report["patches"] for line in entry["drift"]}
    assert names and {name for name in names if name not in columns[2] + columns[3]} == set()
    assert all(entry["file"] in columns[0] for entry in report["patches"])
