"""apply.py as a user runs it: real processes, real wheels, exit codes and one-line messages."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from testing.cli import one_line_error, run_apply


def test_bad_source_is_one_line(tmp_path: Path) -> None:
    result = run_apply("apply", "--from", "tarball:x", "--out", str(tmp_path / "out"))
    assert result.returncode == 1
    assert "is not a source; use wheel, wheel:cpu, image:REF or dir:PATH" in one_line_error(result)
    assert not (tmp_path / "out").exists()


def test_unknown_patch_id_is_one_line() -> None:
    result = run_apply("check", "--until", "9999")
    assert result.returncode == 1 and "no patch 9999 in the stack" in one_line_error(result)


def test_cpu_wheel_end_to_end(tmp_path: Path, two_patches: Path) -> None:
    out = tmp_path / "out"
    first = run_apply("apply", "--from", "wheel:cpu", "--out", str(out), "--patches", str(two_patches), "--json")
    assert first.returncode == 0, first.stderr
    result = json.loads(first.stdout)
    assert [p["status"] for p in result["patches"]] == ["applied", "applied"] and result["written"]
    package = out / "vllm"
    assert any(package.glob("_C*.so")), "compiled objects are laid too"
    assert sorted(p.name for p in out.iterdir()) == ["vllm", "vllm.rigstack"]
    again = run_apply("apply", "--from", "wheel:cpu", "--out", str(out), "--patches", str(two_patches))
    assert again.returncode == 0 and "nothing to do" in again.stderr
    status = json.loads(run_apply("status", str(package), "--json").stdout)
    assert status["flavour"] == "cpu" and [p["id"] for p in status["patches"]] == ["0001", "0002"]
    diff = run_apply("diff", str(package))
    assert diff.stdout == (out / "vllm.rigstack" / "all-changes-vs-baseline.diff").read_text() != ""
    assert run_apply("export", str(package), "--to", str(tmp_path / "exported")).returncode == 0
    for patch in two_patches.glob("*.patch"):
        assert (tmp_path / "exported" / patch.name).read_bytes() == patch.read_bytes()


@pytest.mark.parametrize("flavour", ["wheel", "wheel:cpu"])
def test_the_real_stack_applies_to_both_flavours(tmp_path: Path, flavour: str) -> None:
    out = tmp_path / "never-written"
    result = run_apply("check", "--from", flavour, "--out", str(out), "--json")
    assert result.returncode == 0, result.stderr
    statuses = {p["status"] for p in json.loads(result.stdout)["patches"]}
    assert statuses <= {"applied"}, statuses
    assert not out.exists()


# The downloaded GPU wheel: where the CPU flavour is the twin, it is built here, not downloaded.
def test_a_wheel_with_the_wrong_sha256_is_refused(tmp_path: Path, pins) -> None:
    cache = tmp_path / "cache"
    (cache / "wheels").mkdir(parents=True)
    (cache / "wheels" / pins.vllm_wheel).write_bytes(b"not the wheel")
    result = run_apply("apply", "--from", "wheel", "--out", str(tmp_path / "out"),
                       env={"RIGSTACK_CACHE": str(cache)})
    assert result.returncode == 1
    assert "does not match the pin" in one_line_error(result) and "delete the file" in result.stderr
    assert not (tmp_path / "out").exists()


def test_no_network_points_at_the_cache(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    env = {"RIGSTACK_CACHE": str(cache), "PIP_INDEX_URL": "http://127.0.0.1:9/simple", "PIP_RETRIES": "0",
           "PIP_TIMEOUT": "2", "PIP_FIND_LINKS": "", "PIP_NO_INDEX": ""}
    result = run_apply("apply", "--from", "wheel", "--out", str(tmp_path / "out"), env=env)
    assert result.returncode == 1
    line = one_line_error(result)
    assert "could not download" in line and str(cache / "wheels") in result.stderr.replace("\n", "")
