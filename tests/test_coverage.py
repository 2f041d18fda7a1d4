"""patches/COVERAGE.md stays true: its statuses, patch ids and upstream references are checked against the stack
and the pristine pinned package, so a patch added, renamed or upstreamed without updating the account fails here."""

from __future__ import annotations

import ast
import os
import re
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import pytest

from rigstack.stack import DEFAULT_PATCHES_DIR, Stack, load_stack

COVERAGE = DEFAULT_PATCHES_DIR / "COVERAGE.md"
SEEDS = ("000", "001", "002", "003", "004")
STATUS = re.compile(r"^(?:upstream|patch \d{4}(?: \+ \d{4})*|missing|not applicable|own issue \d+)$")
# `path/file.py:Name` or `path/file.py:Class.method`, paths relative to the vllm package.
SYMBOL_REF = re.compile(r"`([\w/]+\.py):([A-Za-z_][\w.]*)`")
FILE_REF = re.compile(r"`([\w/]+/[\w]+\.py)`")


@dataclass(frozen=True)
class Row:
    seed: str
    change: str
    status: str
    where: str

    @property
    def patch_ids(self) -> tuple[str, ...]:
        return tuple(re.findall(r"\d{4}", self.status)) if self.status.startswith("patch ") else ()


def parse_coverage(text: str) -> list[Row]:
    """The table rows under the header row `| seed | change | status | ... |`."""
    rows: list[Row] = []
    in_table = False
    for line in text.splitlines():
        if line.startswith("| seed |"):
            in_table = True
            continue
        if not in_table or not line.startswith("|") or set(line) <= set("|- "):
            continue
        cells = [cell.strip() for cell in line.strip().strip("|").split(" | ")]
        assert len(cells) == 4, f"COVERAGE.md row has {len(cells)} cells, want 4: {line}"
        rows.append(Row(*cells))
    return rows


@pytest.fixture(scope="module")
def rows() -> list[Row]:
    return parse_coverage(COVERAGE.read_text())


@pytest.fixture(scope="module")
def stack() -> Stack:
    return load_stack()


@pytest.fixture(scope="module")
def pristine(request: pytest.FixtureRequest) -> Path:
    """$RIGSTACK_PRISTINE_VLLM (CI and the test venv set it), else the pinned wheel unpacked."""
    named = os.environ.get("RIGSTACK_PRISTINE_VLLM")
    if named:
        return Path(named)
    return request.getfixturevalue("pristine_cpu_tree")


@cache
def _defined_names(path: Path) -> frozenset[str]:
    """Every top-level and nested class/function name of a module, dotted (`Class.method`)."""
    names: set[str] = set()

    def walk(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
                names.add(prefix + child.name)
                walk(child, prefix + child.name + ".")

    walk(ast.parse(path.read_text()), "")
    return frozenset(names)


def test_table_has_rows_for_every_seed(rows: list[Row]) -> None:
    assert {row.seed for row in rows} == set(SEEDS)
    # The brief of issue 21 asks for at least seed 002's eight groups; a table that lost rows is stale.
    assert sum(row.seed == "002" for row in rows) >= 8


def test_every_status_is_allowed_and_explained(rows: list[Row]) -> None:
    for row in rows:
        assert STATUS.match(row.status), f"COVERAGE.md: status {row.status!r} of {row.change!r} is not allowed"
        assert row.where, f"COVERAGE.md: {row.change!r} has an empty where/evidence/reason cell"
        if row.status == "missing":
            assert row.where.startswith("left:"), f"COVERAGE.md: missing {row.change!r} must say why it is left"
        if row.status == "upstream":
            assert SYMBOL_REF.search(row.where), f"COVERAGE.md: upstream {row.change!r} names no file.py:function"


def test_patch_rows_name_existing_patches_and_every_patch_has_a_row(rows: list[Row], stack: Stack) -> None:
    present = set(stack.ids)
    named = {patch_id for row in rows for patch_id in row.patch_ids}
    assert named <= present, f"COVERAGE.md names patches not in patches/: {sorted(named - present)}"
    assert present <= named, f"patches without a COVERAGE.md row: {sorted(present - named)}"


def test_references_exist_in_the_pristine_package(rows: list[Row], pristine: Path, stack: Stack) -> None:
    added_by_patches = {name for patch in stack.patches for name in patch.touched_files}
    for row in rows:
        for file, name in SYMBOL_REF.findall(row.where):
            source = pristine / file
            assert source.is_file(), f"COVERAGE.md ({row.change}): {file} is not in the pristine package"
            assert name in _defined_names(source), f"COVERAGE.md ({row.change}): {file} defines no {name}"
        for file in FILE_REF.findall(row.where):
            assert (pristine / file).exists() or file in added_by_patches, \
                f"COVERAGE.md ({row.change}): {file} is neither in the pristine package nor added by a patch"


def test_parse_coverage_reads_cells_and_ids() -> None:
    text = "intro\n| seed | change | status | where |\n|---|---|---|---|\n| 002 | a | patch 0004 + 0006 | x |\n"
    assert parse_coverage(text) == [Row("002", "a", "patch 0004 + 0006", "x")]
    assert parse_coverage(text)[0].patch_ids == ("0004", "0006")
