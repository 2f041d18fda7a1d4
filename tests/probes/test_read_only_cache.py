"""Issue 39 item 3, command by command: with the rigstack cache read-only (the real cache, bind-mounted read-only, so
everything each command reads is there), serve, serve --fleet, port, plan, bench and expert-trace each end in one
`error:` line naming what it could not write, exit 1, or finish without needing to write there (plan); none
leaves a process running and none crashes (`bug:`). A full disk takes the same path (OSError ENOSPC instead of
EROFS: tests/test_tool_venv.py and tests/test_launch.py cover both errnos at the top and in the launcher)."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from rigstack.cache import cache_dir
from rigstack.versions import REPO_ROOT
from testing.mounts import mounted

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def read_only_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    with mounted(tmp_path_factory.mktemp("ro") / "cache", "--bind", "-o", "ro", str(cache_dir())) as cache:
        yield cache


def _running_with(text: str) -> list[int]:
    """Processes whose command line holds `text` (the read-only cache's path: every engine the commands would start
    names its model or run folder under it)."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and int(entry.name) != os.getpid() and \
                    text.encode() in (entry / "cmdline").read_bytes():
                found.append(int(entry.name))
        except OSError:
            pass
    return found


def _run(cache: Path, *words: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, *words], cwd=REPO_ROOT, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "RIGSTACK_CACHE": str(cache), "COLUMNS": "400"})


def _one_line(done: subprocess.CompletedProcess[str], *expected: str) -> None:
    errors = [line for line in done.stderr.splitlines() if line.startswith(("error:", "bug:"))]
    assert done.returncode == 1 and len(errors) == 1 and errors[0].startswith("error:"), done.stderr[-3000:]
    assert "Traceback" not in done.stderr and all(text in errors[0] for text in expected), errors[0]


@pytest.mark.parametrize(("words", "expected"), [
    (("-m", "rigstack", "serve", "--profile", "cpu-tiny"), ("Read-only file system",)),
    (("-m", "rigstack", "serve", "--fleet", "cpu-tiny-mixed", "--force"), ("Read-only file system",)),
    # a release the pin is not on (0.34.0 is refused as the stack's own target before the cache is met)
    (("apply.py", "port", "--to", "0.33.0", "--report-only"), ("Read-only file system",)),
])
def test_a_command_that_writes_in_the_cache_says_so_in_one_line(read_only_cache: Path, words: tuple[str, ...],
                                                                 expected: tuple[str, ...]) -> None:
    done = _run(read_only_cache, *words)
    _one_line(done, *expected)
    assert _running_with(str(read_only_cache)) == []


def test_plan_reads_the_cache_and_needs_no_write(read_only_cache: Path) -> None:
    done = _run(read_only_cache, "-m", "rigstack", "plan", "--profile", "cpu-tiny", "--json")
    assert done.returncode == 0, done.stderr[-3000:]
    assert '"pool_tokens"' in done.stdout


@pytest.mark.parametrize("script", ["bench.py", "expert_trace.py"])
def test_a_probe_whose_out_is_read_only_refuses_before_measuring(read_only_cache: Path, fake_server,
                                                                  script: str) -> None:
    """A probe runs for minutes; an --out it cannot write is named before the first request, not after the run."""
    url = fake_server("--counts")
    extra = ("--cache", "2") if script == "expert_trace.py" else ()
    done = _run(read_only_cache, str(REPO_ROOT / "scripts" / script), "--url", url, "--model", "fake", *extra,
                "--out", str(read_only_cache / "result"))
    _one_line(done, str(read_only_cache / "result"))
