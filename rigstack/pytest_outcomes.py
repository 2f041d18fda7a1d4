"""A pytest plugin (`-p rigstack.pytest_outcomes`) that says how each failing test failed, in the JUnit report.

The patch proof (rigstack.patchtests) must tell a test whose assertion failed on the pristine package (the patch's
behaviour is missing there) from one that could not run at all (the patch's new module, file, name or fixture is
missing), so it reads pytest's own outcome data instead of the report's text: the phase, the exception's type and
which code raised it. The verdict is a user property, which pytest's junitxml writes per test.

With RIGSTACK_PROOF_REACH naming a JSON list of files of the package under test, the plugin also records, per
failing test, which of them ran a line inside one of their functions during the test's own setup and call
(coverage.py, one context per test): a failure proves a patch's behaviour only where the test reached the code the
patch changes. A Python child process the test starts as a new interpreter (subprocess, multiprocessing's spawn)
counts too: coverage.py's own startup hook (the .pth it installs) measures it when COVERAGE_PROCESS_START names a
config, and the child writes its data, at exit or on SIGTERM, into a folder of the test that started it. A forked
child, or one killed outright, is not measured; its work counts as not reached (a proof must not claim more than it
shows).
"""

from __future__ import annotations

import ast
import importlib.util
import json
import os
import re
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from rigstack.outcomekinds import ASSERTION, COULD_NOT_RUN, DESELECTED_OPTION, PROPERTY, RAISED, REACH_ENV
# Exceptions that mean the code under test is not there, wherever they are raised: a module or file, a name or an
# argument the patch adds to an existing one, or a key it adds to a registry (counted as missing even where a bug
# could raise them: a proof must not claim more than it shows).
_MISSING = (ImportError, FileNotFoundError, AttributeError, TypeError, KeyError)
_DESELECTED = pytest.StashKey[list]()
_REACH = pytest.StashKey["_Reach"]()
_PACKAGE = pytest.StashKey["Path | None"]()
_CHILD_DATA = "RIGSTACK_PROOF_CHILD_DATA"  # the data folder of the test running now, for its child processes
_PYTEST_DIRS = (Path(pytest.__file__).parent.parent / "_pytest", Path(pytest.__file__).parent.parent / "pluggy")


def failure_kind(when: str, excinfo: pytest.ExceptionInfo[BaseException], test_dirs: tuple[Path, ...],
                 package: Path | None) -> str:
    """ASSERTION: an AssertionError (or pytest.fail, pytest.raises' "DID NOT RAISE") raised by code in the test's
    own folders while the test ran; RAISED: any other exception raised from inside the package under test
    (`package`, resolved: it ran and failed); COULD_NOT_RUN: a failure in setup (a fixture missing or failing), a
    missing module, file, name, argument or key, or an exception only the test's own code raised (a queue left empty
    by a dead child)."""
    if when != "call" or excinfo.errisinstance(_MISSING):
        return COULD_NOT_RUN
    if excinfo.errisinstance((AssertionError, pytest.fail.Exception)):
        raiser = _raising_file(excinfo)
        if raiser is not None and any(raiser.is_relative_to(folder) for folder in test_dirs):
            return ASSERTION
    if package is not None and any(Path(str(entry.path)).resolve().is_relative_to(package)
                                   for entry in excinfo.traceback):
        return RAISED
    return COULD_NOT_RUN


def _raising_file(excinfo: pytest.ExceptionInfo[BaseException]) -> Path | None:
    """The innermost frame outside pytest itself (pytest.fail raises from inside _pytest)."""
    for entry in reversed(excinfo.traceback):
        path = Path(str(entry.path)).resolve()
        if not any(path.is_relative_to(folder) for folder in _PYTEST_DIRS):
            return path
    return None


def _package() -> Path | None:
    """The vllm package folder this process imports (the proof puts the package under test first on the path)."""
    spec = importlib.util.find_spec("vllm")
    return Path(os.path.abspath(spec.origin)).parent if spec and spec.origin else None


def function_lines(source: str) -> frozenset[int]:
    """Lines inside the bodies of a module's functions and methods: what runs when the code is called, not when the
    module is imported."""
    lines: set[int] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            body = node.body if isinstance(node.body, list) else [node.body]
            lines.update(range(body[0].lineno, max(part.end_lineno or part.lineno for part in body) + 1))
    return frozenset(lines)


class _Reach:
    """coverage.py over the watched files: in this process one dynamic context per test id; in the child processes a
    test starts, a data folder per test, named in the environment they inherit (coverage.py expands it in their
    config)."""

    def __init__(self, package: Path, files: list[str]) -> None:
        import coverage

        # Keyed by resolved path: coverage names a file as the code object does, maybe through a link.
        self.lines = {(package / name).resolve(): (name, function_lines((package / name).read_text()))
                      for name in files if (package / name).is_file()}
        include = [str(path) for path in self.lines] + [str(package / name) for name in files]
        self.coverage = coverage.Coverage(data_file=None, config_file=False, include=include)
        self.coverage.start()
        self.children = Path(tempfile.mkdtemp(prefix="rigstack-reach-"))
        (self.children / "outside").mkdir()
        self.tests = 0
        config = self.children / "children.ini"
        # A child started outside a test (a session fixture's) writes to "outside", which no test reads.
        config.write_text(f"[run]\nparallel = true\nsigterm = true\n"
                          f"data_file = ${{{_CHILD_DATA}-{self.children / 'outside'}}}/child\n"
                          "include =\n" + "".join(f"    {path}\n" for path in include))
        os.environ["COVERAGE_PROCESS_START"] = str(config)

    def begin(self, test_id: str) -> None:
        self.coverage.switch_context(test_id)
        self.tests += 1
        os.environ[_CHILD_DATA] = str(self.children / str(self.tests))
        Path(os.environ[_CHILD_DATA]).mkdir()

    def end(self) -> None:
        self.coverage.switch_context("")
        os.environ.pop(_CHILD_DATA, None)

    def reached(self, test_id: str) -> list[str]:
        from coverage import CoverageData
        from coverage.exceptions import CoverageException

        data = self.coverage.get_data()
        data.set_query_contexts([f"^{re.escape(test_id)}$"])
        found = self._found(data)
        # The children this test started, each its own data file (written when it ended).
        for path in Path(os.environ.get(_CHILD_DATA, self.children / "outside")).glob("child.*"):
            child = CoverageData(basename=str(path))
            try:
                child.read()
            except CoverageException:
                continue  # a child still writing it (the test did not wait for it): not counted
            found |= self._found(child)
        return sorted(found)

    def _found(self, data: Any) -> set[str]:
        found = set()
        for measured in data.measured_files():
            name, lines = self.lines.get(Path(measured).resolve(), (None, frozenset()))
            if name is not None and lines & set(data.lines(measured) or ()):
                found.add(name)
        return found

    def stop(self) -> None:
        self.coverage.stop()
        os.environ.pop("COVERAGE_PROCESS_START", None)
        shutil.rmtree(self.children, ignore_errors=True)


def pytest_configure(config: pytest.Config) -> None:
    watched = os.environ.get(REACH_ENV)
    package = _package()
    config.stash[_PACKAGE] = package.resolve() if package is not None else None
    if watched and package is not None:
        config.stash[_REACH] = _Reach(package, json.loads(Path(watched).read_text()))


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item) -> Iterator[None]:
    reach = item.config.stash.get(_REACH, None)
    if reach is not None:
        reach.begin(item.nodeid)
    yield
    if reach is not None:
        reach.end()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    outcome = yield
    report = outcome.get_result()
    if report.failed and call.excinfo is not None:
        root = Path(str(item.config.rootpath)).resolve()
        kind = failure_kind(call.when, call.excinfo, (root / "tests", root / "testing", Path(str(item.path)).parent),
                            item.config.stash[_PACKAGE])
        verdict: dict[str, object] = {"when": call.when, "kind": kind, "type": call.excinfo.typename}
        reach = item.config.stash.get(_REACH, None)
        if reach is not None:
            verdict["reached"] = reach.reached(item.nodeid)
        # junitxml writes the properties of the teardown report, which pytest builds from the item's.
        item.user_properties.append((PROPERTY, json.dumps(verdict)))


def pytest_unconfigure(config: pytest.Config) -> None:
    reach = config.stash.get(_REACH, None)
    if reach is not None:
        reach.stop()


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
