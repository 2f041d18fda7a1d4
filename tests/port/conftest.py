"""The port tests' fixture: a fresh synthetic release pair (testing.port.Pair) in each test's own folder."""

from __future__ import annotations

from pathlib import Path

import pytest

from testing.port import Pair


@pytest.fixture()
def pair(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Pair:
    return Pair(tmp_path, monkeypatch)
