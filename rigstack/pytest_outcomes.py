"""A pytest plugin (`-p rigstack.pytest_outcomes`) that says how each failing test failed, in the JUnit report.

The patch proof (rigstack.patchtests) must tell a test whose assertion failed on the pristine package (the patch's
behaviour is missing there) from one that could not run at all (the patch's new module, file or fixture is missing),
so it reads pytest's own outcome data instead of the report's text: the phase, the exception's type and whether
it was raised by the test's own code. The verdict is a user property, which pytest's junitxml writes per test.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from rigstack.outcomekinds import ASSERTION, COULD_NOT_RUN, DESELECTED_OPTION, PROPERTY, RAISED
# Exceptions that mean the code under test is not there, wherever they are raised: a module or file, or a name or
# an argument the patch adds to an existing one (counted as missing even where a bug could raise them: a proof must
# not claim more than it shows).
_MISSING = (ImportError, FileNotFoundError, AttributeError, TypeError)
_DESELECTED = pytest.StashKey[list]()
_PYTEST_DIRS = (Path(pytest.__file__).parent.parent / "_pytest", Path(pytest.__file__).parent.parent / "pluggy")


def failure_kind(when: str, excinfo: pytest.ExceptionInfo[BaseException], test_dirs: tuple[Path, ...]) -> str:
    """ASSERTION: an AssertionError (or pytest.fail, pytest.raises' "DID NOT RAISE") raised by code in the test's
    own folders while the test ran; COULD_NOT_RUN: a failure in setup (a fixture missing or failing) or a missing
    module, file, name or argument; RAISED: any other exception from the code under test (it ran and failed)."""
    if when != "call" or excinfo.errisinstance(_MISSING):
        return COULD_NOT_RUN
    if excinfo.errisinstance((AssertionError, pytest.fail.Exception)):
        raiser = _raising_file(excinfo)
        if raiser is not None and any(raiser.is_relative_to(folder) for folder in test_dirs):
            return ASSERTION
    return RAISED


def _raising_file(excinfo: pytest.ExceptionInfo[BaseException]) -> Path | None:
    """The innermost frame outside pytest itself (pytest.fail raises from inside _pytest)."""
    for entry in reversed(excinfo.traceback):
        path = Path(str(entry.path)).resolve()
        if not any(path.is_relative_to(folder) for folder in _PYTEST_DIRS):
            return path
    return None


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    outcome = yield
    report = outcome.get_result()
    if report.failed and call.excinfo is not None:
        root = Path(str(item.config.rootpath)).resolve()
        kind = failure_kind(call.when, call.excinfo, (root / "tests", root / "testing", Path(str(item.path)).parent))
        # junitxml writes the properties of the teardown report, which pytest builds from the item's.
        item.user_properties.append((PROPERTY, json.dumps({"when": call.when, "kind": kind,
                                                           "type": call.excinfo.typename})))


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(DESELECTED_OPTION, dest="rigstack_deselected", default=None,
                     help="write the node ids the -m expression deselects to this file (JSON)")


def pytest_deselected(items: list[pytest.Item]) -> None:
    if items:
        items[0].config.stash.setdefault(_DESELECTED, []).extend(item.nodeid for item in items)


def pytest_sessionfinish(session: pytest.Session) -> None:
    path = session.config.getoption("rigstack_deselected")
    if path:
        Path(path).write_text(json.dumps(session.config.stash.get(_DESELECTED, [])))
