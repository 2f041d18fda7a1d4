"""Result files: provenance from the package stamp, CSV columns, and the atomic write."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rigstack.errors import UserError
from rigstack.probes.results import find_package, load_result, percentiles, rows_csv, write_result
from rigstack.stamp import Stamp, StampedPatch, write_stamp
from testing.probes import make_result


def test_find_package(tmp_path: Path) -> None:
    package = tmp_path / "vllm"
    package.mkdir()
    (package / "__init__.py").write_text("")
    assert find_package(package, "http://10.0.0.5:8000") == package
    # Not local and not given: the server's package is out of reach, so no stack hash is claimed.
    assert find_package(None, "http://10.0.0.5:8000") is None
    assert find_package(None, "http://127.0.0.1:8000").name == "vllm"
    with pytest.raises(UserError, match="is not a vllm package folder"):
        find_package(tmp_path, "http://127.0.0.1:1")


def test_stamp_reaches_the_result(tmp_path: Path) -> None:
    from rigstack.probes.results import read_stamp

    package = tmp_path / "vllm"
    package.mkdir()
    (package / "__init__.py").write_text("")
    write_stamp(package, Stamp(tool_version="0.1.0", vllm_version="0.32.0", flavour="cpu", source="wheel:cpu",
                               baseline_fingerprint="sha256:aa", baseline_commit="c0", head_commit="c1",
                               stack_hash="sha256:feed", patches=(StampedPatch(id="0001", file="0001-x.patch",
                                                                                sha256="s", status="applied"),)))
    stamp = read_stamp(find_package(package, "http://127.0.0.1:1"))
    assert stamp is not None and stamp.stack_hash == "sha256:feed" and stamp.patch_ids == ("0001",)


def test_write_and_reload(tmp_path: Path) -> None:
    result = make_result(metrics={"x": (1.0, "higher")}).model_copy(update={"rows": [{"a": 1}, {"a": 2, "b": 3}]})
    written = write_result(result, tmp_path / "r")
    assert [p.name for p in written] == ["r.json", "r.csv"]
    assert (tmp_path / "r.csv").read_text() == "a,b\n1,\n2,3\n"
    assert load_result(tmp_path / "r.json") == result
    assert json.loads((tmp_path / "r.json").read_text())["schema_version"] == 1
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temp files left


def test_percentiles() -> None:
    assert percentiles([1.0, 2.0, 3.0, 4.0]) == {"p50": 2.5, "p90": 3.7, "p99": pytest.approx(3.97)}
    assert percentiles([]) == {"p50": None, "p90": None, "p99": None}
    assert rows_csv([]) == "\n"
