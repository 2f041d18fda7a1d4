"""port --skip and --abort: a dropped patch, and the state before the port restored."""

from __future__ import annotations

import shlex
import shutil
import sys
from pathlib import Path

import pytest

from rigstack import cli, main, port
from rigstack.errors import UserError
from testing.port import NEW, NEW_TREE, OLD, Pair
from testing.port import statuses as _statuses


def test_skip_drops_the_patch_and_write_leaves_a_note(pair: Pair, monkeypatch: pytest.MonkeyPatch) -> None:
    # A local index whose file is not what its hash says (a damaged download), instead of the real index.
    index = pair.root / "index"
    (index / "simple" / "vllm").mkdir(parents=True)
    served = shutil.move(pair.new_sdist, index / pair.new_sdist.name)
    (index / "simple" / "vllm" / "index.html").write_text(f'<a href="../../{served.name}#sha256={"0" * 64}">x</a>\n')
    monkeypatch.setenv("PIP_INDEX_URL", f"file://{index}/simple/")
    sdist_before = (pair.pins.vllm_sdist, pair.pins.vllm_sdist_sha256)
    pair.run("start")
    area = pair.work / f"port-{OLD}-to-{NEW}"
    (area / "vllm" / "parser.py").write_text("half an edit\n")
    done = pair.run("skip")
    assert _statuses(done) == ["clean", "moved", "upstreamed", "dropped", "clean"]
    assert (area / "vllm" / "parser.py").read_text() == NEW_TREE["parser.py"], "the new release's file is back"
    assert port._repo(area).dirty_files() == []
    written = pair.run("write")
    assert (pair.pins.vllm_version, (pair.pins.vllm_sdist, pair.pins.vllm_sdist_sha256)) == (NEW, sdist_before)
    assert written.state.notes[-1] == (
        f"VLLM_SDIST stays {sdist_before[0]}: vllm-{NEW}.tar.gz downloaded damaged (its sha256 is not the index's "
        f"{'0' * 64}); rerun; until VLLM_SDIST and VLLM_SDIST_SHA256 name vLLM {NEW}'s sdist, "
        "scripts/upstream_tests.py refuses to run")
    assert not pair.new_sdist.exists(), "a damaged download is not kept in the cache"
    assert not (pair.patches / "0004-parser-null.patch").exists()
    assert "dropped with --skip" in (pair.patches / "0004-parser-null.dropped").read_text()


def test_abort_returns_to_the_state_before_the_port(pair: Pair) -> None:
    before = pair.snapshot()
    stopped = pair.run("start")
    (Path(stopped.work) / "vllm" / "parser.py").write_text("an edit the abort discards\n")
    aborted = pair.run("abort")
    assert "as before the port" in aborted.message
    assert not Path(stopped.work).exists() and pair.snapshot() == before
    with pytest.raises(UserError, match="no port in progress"):
        pair.run("continue")


@pytest.mark.parametrize("ran", ["rigstack", "apply.py"])
def test_the_printed_commands_run_as_printed(pair: Pair, monkeypatch: pytest.MonkeyPatch, ran: str) -> None:
    """Issue 29 item 9: a port's hints name the command the way the user ran it (`rigstack port` or `python apply.py
    port`) with its --work, so `--skip` as printed, run from another folder, drops the patch (before: `python
    apply.py port --skip` without --work, which looked in ./build: "no port in progress")."""
    monkeypatch.setattr(sys, "argv", [str(pair.root / "venv" / "bin" / ran), "port"])
    monkeypatch.chdir(pair.root / "old")  # no build/ here
    prog = "rigstack" if ran == "rigstack" else "python apply.py"
    stopped = pair.run("start")
    skip = f"{prog} port --skip --work {pair.work}"
    assert f"`{skip}` drops this patch (recorded as dropped)" in stopped.instructions
    assert stopped.error.endswith(f"then `{prog} port --continue --work {pair.work}` (or --skip / --abort)")
    assert cli.run(main.app, shlex.split(skip)[len(prog.split()):]) == 0
    done = port._load(pair.work / f"port-{OLD}-to-{NEW}")
    assert [entry.status for entry in done.patches][3] == "dropped" and done.status == "done"
