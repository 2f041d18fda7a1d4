"""The one cache folder shared by the tool, the tests and CI (downloads, extracted baselines, venvs)."""

from __future__ import annotations

import os
from pathlib import Path


def cache_dir() -> Path:
    """$RIGSTACK_CACHE, else $XDG_CACHE_HOME/rigstack, else ~/.cache/rigstack."""
    explicit = os.environ.get("RIGSTACK_CACHE")
    if explicit:
        return Path(explicit)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "rigstack"


def wheels_dir() -> Path:
    path = cache_dir() / "wheels"
    path.mkdir(parents=True, exist_ok=True)
    return path
