"""compare.py: regressions by direction and tolerance, and bad files as one-line errors."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from rigstack.errors import UserError
from rigstack.probes.compare import EXIT_REGRESSION, compare, compare_files, parse_tolerances
from rigstack.probes.results import write_result
from testing.probes import last_line, make_result, run_script

BASE = {"c1.aggregate_tok_s": (100.0, "higher"), "c1.ttft_ms_p50": (50.0, "lower"), "items": (11.0, "equal"),
        "c1.failed": (0.0, "lower")}


def _write(tmp_path: Path, name: str, **changes: tuple[float | None, str]) -> Path:
    stem = tmp_path / name
    write_result(make_result(metrics={**BASE, **changes}), stem)
    return stem.with_suffix(".json")


def test_same_result_passes(tmp_path: Path) -> None:
    a = _write(tmp_path, "a")
    assert compare_files(a, a, []).exit_code == 0


@pytest.mark.parametrize("change, why", [
    ({"c1.aggregate_tok_s": (90.0, "higher")}, "fell 10.0%"),
    ({"c1.ttft_ms_p50": (60.0, "lower")}, "rose 20.0%"),
    ({"items": (10.0, "equal")}, "changed"),
    ({"c1.failed": (1.0, "lower")}, "rose from 0"),
    ({"c1.aggregate_tok_s": (None, "higher")}, "missing in B"),
])
def test_wrong_way_beyond_tolerance_is_a_regression(tmp_path: Path, change: dict, why: str) -> None:
    a, b = make_result(metrics=BASE), make_result(metrics={**BASE, **change})
    rows, _ = compare(a, b, parse_tolerances(["0.05"]))
    assert [row[3] for row in rows if row[3]] == [why]


def test_within_tolerance_and_better_pass(tmp_path: Path) -> None:
    a = _write(tmp_path, "a")
    b = _write(tmp_path, "b", **{"c1.aggregate_tok_s": (96.0, "higher"), "c1.ttft_ms_p50": (20.0, "lower")})
    assert compare_files(a, b, ["0.05"]).exit_code == 0
    # The same file fails with a tighter tolerance for that one metric (globs, last match wins).
    assert compare_files(a, b, ["0.05", "*.aggregate_tok_s=0.01"]).exit_code == EXIT_REGRESSION


def test_cli_exit_codes_and_messages(tmp_path: Path) -> None:
    a = _write(tmp_path, "a")
    b = _write(tmp_path, "b", **{"c1.aggregate_tok_s": (50.0, "higher")})
    assert run_script("compare.py", str(a), str(a)).returncode == 0
    worse = run_script("compare.py", str(a), str(b), "--tol", "0.1")
    assert worse.returncode == EXIT_REGRESSION
    assert "1 regression(s): c1.aggregate_tok_s fell 50.0%" in last_line(worse)


@pytest.mark.parametrize("content, message", [
    ("", "empty file; rerun the probe that writes it"),
    ("   \n", "empty file"),
    ("{not json", "not JSON (Expecting property name enclosed in double quotes at line 1)"),
    ('{"hello": 1}', "not a rigstack probe result (no schema_version)"),
    ('{"schema_version": 99}', "result schema 99, this tool reads 1"),
    ('{"schema_version": 1, "kind": "bench"}', "malformed result (provenance: Field required)"),
    ("[" * 100_000 + "]" * 100_000, "JSON nested too deep to be a probe result"),  # issue 39 item 12: a bug: crash
])
def test_bad_files_are_one_line_errors(tmp_path: Path, content: str, message: str) -> None:
    good = _write(tmp_path, "good")
    bad = tmp_path / "bad.json"
    bad.write_text(content)
    process = run_script("compare.py", str(good), str(bad))
    assert process.returncode == 1
    assert last_line(process).startswith(f"error: {bad}: ")
    assert message in last_line(process)
    assert "Traceback" not in process.stderr


def test_missing_file_and_kind_mismatch(tmp_path: Path) -> None:
    good = _write(tmp_path, "good")
    missing = run_script("compare.py", str(good), str(tmp_path / "nope.json"))
    assert missing.returncode == 1 and "no such result file" in last_line(missing)
    other = tmp_path / "q"
    write_result(make_result(kind="qual", metrics={"passed": (3.0, "higher")}), other)
    with pytest.raises(UserError, match="A is a bench result and B a qual result"):
        compare_files(good, other.with_suffix(".json"), [])


@pytest.mark.parametrize("spec", ["fast", "x=abc", "-0.1", "nan", "inf", "*.ttft_ms=nan"])
def test_bad_tolerance(spec: str) -> None:
    with pytest.raises(UserError, match="--tol"):
        parse_tolerances([spec])


@pytest.mark.parametrize("value", ["NaN", "Infinity", '"nan"', '"12"', "true"])
def test_a_metric_that_is_no_finite_number_is_an_error_not_a_pass(tmp_path: Path, value: str) -> None:
    """Issue 39 item 7: B's metrics as NaN or strings made compare say "no regression" and exit 0."""
    good = _write(tmp_path, "good")
    bad = tmp_path / "bad.json"
    bad.write_text(good.read_text().replace('"value": 100.0', f'"value": {value}', 1))
    assert bad.read_text() != good.read_text()
    process = run_script("compare.py", str(good), str(bad))
    assert process.returncode == 1, process.stdout
    assert "metric c1.aggregate_tok_s is" in last_line(process) and "not a finite number" in last_line(process)


@pytest.mark.parametrize("kind", ["fifo", "folder"])
def test_a_result_path_that_is_no_file_is_refused_not_read(tmp_path: Path, kind: str) -> None:
    """Issue 39 item 12: a FIFO given as a result blocked compare forever."""
    good = _write(tmp_path, "good")
    bad = tmp_path / "bad.json"
    os.mkfifo(bad) if kind == "fifo" else bad.mkdir()
    process = run_script("compare.py", str(good), str(bad), timeout=60)
    assert process.returncode == 1 and last_line(process).startswith(f"error: result file {bad}: ")
    assert "not a regular file; pass a .json file a probe wrote" in last_line(process)
