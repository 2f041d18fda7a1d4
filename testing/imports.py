"""Shared by the import tests (a pytest plugin, loaded by the root conftest): a small fork of the pinned package,
an empty patch folder, and running `import` as the library and as the command."""

from __future__ import annotations

from pathlib import Path

import pytest

from rigstack import cli, importer
from rigstack.commands import stack as apply_cli
from testing.forks import Repo


@pytest.fixture()
def fork(pristine_cpu_tree: Path, tmp_path: Path) -> Repo:
    repo = Repo(tmp_path / "fork", pristine_cpu_tree, "vllm/")
    (repo.root / "tests").mkdir()
    (repo.root / "tests" / "test_x.py").write_text("X = 1\n")
    repo.commit("tests")
    return repo


@pytest.fixture()
def patches(tmp_path: Path) -> Path:
    folder = tmp_path / "patches"
    folder.mkdir()
    return folder


def run_import(pins, patches: Path, *sources: Path | str, **options) -> importer.ImportResult:  # noqa: ANN001, ANN003
    return importer.import_patches([str(source) for source in sources], pins, patches_dir=patches, base="wheel:cpu",
                                   **options)


def run_cli(capsys: pytest.CaptureFixture, *args: str) -> tuple[int, str]:
    code = cli.run(apply_cli.app, list(args))
    return code, capsys.readouterr().err


def snapshot(folder: Path, pattern: str = "*") -> dict[str, bytes]:
    return {path.name: path.read_bytes() for path in sorted(folder.glob(pattern))}


def header_of(path: Path) -> list[str]:
    return path.read_text().partition("\n---\n")[0].splitlines()
