"""port's start: what it refuses before any work (an open port, uncommitted changes, a bad hash or version) and
--base dir:, the old baseline from a folder."""

from __future__ import annotations

import shutil

import pytest

from rigstack import applier, port
from rigstack.baseline import parse_source, sha256_of
from rigstack.errors import UserError
from rigstack.stack import load_stack
from testing.port import NEW, OLD, RESOLVED, Pair
from testing.port import statuses as _statuses


def test_a_new_start_refuses_an_open_port_and_uncommitted_changes(pair: Pair) -> None:
    pair.run("start")
    with pytest.raises(UserError, match="already in progress"):
        pair.run("start")
    area = pair.work / f"port-{OLD}-to-{NEW}"
    (area / "vllm" / "parser.py").write_text(RESOLVED)
    pair.run("continue")
    with pytest.raises(UserError, match="does not match --sha256"):
        pair.run("start", sha256="1" * 64)
    assert port._load(area).status == "done", "a start refused before any work keeps the finished port"
    edited = area / "vllm" / "fixed.py"
    edited.write_text("my own fix\n")
    with pytest.raises(UserError, match=r"has uncommitted changes \(fixed.py\); nothing was touched"):
        pair.run("start")
    assert edited.read_text() == "my own fix\n"


def test_bad_sha256_and_bad_versions_are_refused_before_any_work(pair: Pair) -> None:
    with pytest.raises(UserError, match="does not match --sha256 " + "0" * 64):
        pair.run("start", sha256="0" * 64)
    with pytest.raises(UserError, match="already targets vLLM 9.0.0"):
        pair.run("start", to=OLD)
    with pytest.raises(UserError, match="is not a vLLM version"):
        pair.run("start", to="newest")
    assert not pair.work.exists() or not any(pair.work.iterdir())
    patched = pair.root / "site" / "vllm"
    shutil.copytree(pair.root / "old" / "vllm", patched, ignore=shutil.ignore_patterns(".git"))
    applier.apply_stack(parse_source(f"dir:{patched}"), load_stack(pair.patches).select("0001")[0], pair.pins)
    (patched / "fixed.py").write_text("my own fix\n")
    with pytest.raises(UserError, match=r"has uncommitted changes \(fixed.py\); nothing was touched"):
        pair.run("start", source=f"dir:{patched}")
    assert (patched / "fixed.py").read_text() == "my own fix\n"
    report = pair.run("start", sha256=sha256_of(pair.new_wheel).upper())
    assert report.state.new.sha256 == sha256_of(pair.new_wheel)


def test_base_dir_is_the_old_baseline(pair: Pair) -> None:
    """--base dir:PATH: a stack made on a package folder (a fork's build) replays from that folder's files."""
    base = pair.root / "fork-build" / "vllm"
    shutil.copytree(pair.root / "old" / "vllm", base, ignore=shutil.ignore_patterns(".git"))
    report = pair.run("report-only", base=f"dir:{base}")
    assert _statuses(report) == ["clean", "moved", "upstreamed", "conflict", "clean"]
    old = report.state.old
    assert (old.version, old.source, old.wheel, old.sha256) == (OLD, f"dir:{base}", None, None)
    assert old.fingerprint == pair.pins.vllm_fingerprint_gpu
    applier.apply_stack(parse_source(f"dir:{base}"), load_stack(pair.patches).select("0001")[0], pair.pins)
    with pytest.raises(UserError, match=f"was patched by rigstack; a port needs the pristine vLLM {OLD} package: "
                                        "point --base dir: at one, or use --base wheel"):
        pair.run("start", base=f"dir:{base}")
