"""Prove the patch tests: each patch's tests pass on the patched package and fail on the stack below that patch.

The test files of a patch are the ones its `Tests:` header names. pytest runs them with this interpreter and
PYTHONPATH on a package: once on the fully patched package (one run for every patch), and once on each patch's
baseline, the pristine package with the patches below it applied (rigstack.proofbaselines; the first patch's is the
pristine package itself), so a test of patch N that patch N-k's code already satisfies proves nothing about N. The
JUnit reports are compared test by test. A test marked `upstream_guard` (tests/patches/conftest.py) checks behaviour
the patch must keep, so it has to pass on both; every other test has to fail on the baseline, or it proves nothing
about the patch.

How a test failed on the baseline decides what it proves (rigstack.pytest_outcomes reads it from pytest): it proves
the patch's behaviour only where the test ran a function of a baseline file the patch changes (coverage, in the
test's own process) and then its own assertion failed, or the package's code raised; any other failure (a collection
error, a failing or missing fixture, a missing module, file, name, argument or key, an exception only the test's code
raised, a test that never reached the changed files) proves only that the patch adds something. A patch with no test
of the first kind is "additive", and where it also changes modules its baseline has, its wiring is unproven and the
verdict says so. Each patch pins the verdict its tests earn in its `Proof:` header; a verdict that moves is a
problem, so a patch cannot slide from behaviour to additive with CI green. Tests the markers leave out (server tests
by default) are listed per patch as not proven here.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ElementTree
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path


from rigstack import proofbaselines
from rigstack.errors import UserError
from rigstack.outcomekinds import (ASSERTION, BEHAVIOUR, COULD_NOT_RUN, DESELECTED_OPTION, NEW_FILES_ONLY, PROPERTY,
                                   RAISED, REACH_ENV, WIRING_UNPROVEN)
from rigstack.proofbaselines import PRISTINE
from rigstack.stack import Stack
from rigstack.versions import REPO_ROOT, Pins, load_pins

GUARD = "upstream_guard"
DEFAULT_MARKERS = "not server"
PASSED, FAILED, SKIPPED = "passed", "failed", "skipped"
_LISTED = re.compile(r"[^\s,]+\.py")
OUTCOMES_PLUGIN = "rigstack.pytest_outcomes"
# The proof's own machinery: a change to any of these can move every verdict, so make check proves every patch.
HARNESS = ("rigstack/patchtests.py", "rigstack/proofbaselines.py", "rigstack/pytest_outcomes.py",
           "rigstack/outcomekinds.py", "testing/",
           "tests/patches/conftest.py", "tests/patches/test_prove_baseline_failures.py")


@dataclass(frozen=True)
class SuiteRun:
    """One pytest run over the patch tests against one package: outcome per test id, and the files that
    could not even be imported (all their tests count as failed)."""

    outcomes: dict[str, str]
    guards: frozenset[str]
    broken_files: frozenset[str]
    reasons: dict[str, str] = field(default_factory=dict)  # test id or broken file -> pytest's message
    kinds: dict[str, str] = field(default_factory=dict)  # failed test id -> how it failed (rigstack.pytest_outcomes)
    deselected: frozenset[str] = frozenset()  # node ids the markers left out
    reached: dict[str, frozenset[str]] = field(default_factory=dict)  # failed test id -> watched files it ran

    def outcome(self, test_id: str) -> str | None:
        if test_id in self.outcomes:
            return self.outcomes[test_id]
        return FAILED if test_id.split("::")[0] in self.broken_files else None

    def failure_kind(self, test_id: str) -> str:
        """How a failed test failed; a file that could not be collected could not run any of its tests."""
        if test_id not in self.outcomes and test_id.split("::")[0] in self.broken_files:
            return COULD_NOT_RUN
        return self.kinds.get(test_id, COULD_NOT_RUN)  # no verdict: the process died or a hook failed


@dataclass(frozen=True)
class PatchProof:
    patch_id: str
    files: tuple[str, ...]
    tests: int  # tests that ran on the patched package
    guards: int
    patched_passed: int
    baseline_failed: int  # non-guard tests that failed on the baseline, as they must
    skipped: int
    problems: tuple[str, ...]
    # Of baseline_failed: tests whose own assertion failed there, or whose code under test raised there (the
    # patch's behaviour is missing), and tests that could not run there (its module, file, name or fixture is).
    by_behaviour: int = 0
    could_not_run: int = 0
    wires: bool = True  # the patch changes a module its baseline has, not only adds files
    not_run: tuple[str, ...] = ()  # tests its Tests: header names that the markers left out (server tests)
    baseline: str = PRISTINE  # what it was judged against: "pristine", or "stack to 0016" (rigstack.proofbaselines)

    @property
    def ok(self) -> bool:
        return not self.problems

    @property
    def earned(self) -> str:
        """What the tests show, problems aside: a test of the patch's behaviour, or only that it adds files."""
        if self.by_behaviour:
            return BEHAVIOUR
        return WIRING_UNPROVEN if self.wires else NEW_FILES_ONLY

    @property
    def verdict(self) -> str:
        return self.earned if self.ok else "NOT PROVEN"


@dataclass(frozen=True)
class Proof:
    pristine: Path
    patched: Path
    patches: tuple[PatchProof, ...]
    markers: str = DEFAULT_MARKERS  # the pytest -m expression the tests ran under
    baselines: dict[str, Path] = field(default_factory=dict)  # baseline label -> its package folder

    @property
    def ok(self) -> bool:
        return all(patch.ok for patch in self.patches)


@dataclass(frozen=True)
class PytestSetup:
    """Where and how pytest runs: from this repository by default; vLLM's own tests run from the sdist's tree, with
    extra folders after the package on the import path and extra environment variables."""

    cwd: Path = REPO_ROOT
    args: tuple[str, ...] = ()
    path: tuple[Path, ...] = ()
    env: tuple[tuple[str, str], ...] = ()
    by_folder: bool = True  # one pytest process per test folder (see run_tests)
    # A pytest process killed by a signal (a test that aborts the interpreter) writes no report: rerun its files one
    # by one and count the file that dies as broken, with the signal and the test as the reason, instead of failing.
    split_on_crash: bool = False


def patch_test_files(stack: Stack, only: tuple[str, ...] = ()) -> dict[str, tuple[str, ...]]:
    """Patch id -> the repository-relative test files its `Tests:` header names."""
    files: dict[str, tuple[str, ...]] = {}
    for patch in stack.patches:
        if not only or patch.id in only:
            files[patch.id] = tuple(dict.fromkeys(_LISTED.findall(patch.header.tests)))
    if only and set(only) - set(files):
        raise UserError(f"no patch {', '.join(sorted(set(only) - set(files)))} in the stack; "
                        f"pick from {', '.join(patch.id for patch in stack.patches)}")
    return files


def check_package_folder(package: Path) -> None:
    """The cheap part of the check: the folder is a vllm package (callers run it before any slow step)."""
    if not (package / "__init__.py").is_file() or package.name != "vllm":
        raise UserError(f"{package} is not a vllm package folder (it needs vllm/__init__.py); pass the folder "
                        "itself, e.g. --patched /tmp/site/vllm")


def _check_package(package: Path, env: dict[str, str]) -> None:
    check_package_folder(package)
    # PYTHONPATH must win over the interpreter's own copy, or both runs would test the same package.
    where = "import importlib.util; print(importlib.util.find_spec('vllm').origin)"
    found = subprocess.run([sys.executable, "-c", where], env=env, cwd=REPO_ROOT, capture_output=True, text=True)
    origin = Path(found.stdout.strip() or "?")
    if found.returncode != 0 or origin.resolve() != (package / "__init__.py").resolve():
        raise UserError(f"with PYTHONPATH={package.parent} this interpreter imports vllm from {origin}, not "
                        f"{package}; is {package.parent} shadowed by a .pth entry or an editable install?")


def run_tests(package: Path, files: list[str], markers: str = DEFAULT_MARKERS,
              setup: PytestSetup = PytestSetup(), reach: tuple[str, ...] = ()) -> SuiteRun:
    """Run pytest on `files` with `package` first on the import path; the outcome of every test, and for each failed
    one which of the `reach` files (relative to the package) it ran a function of.

    Each test folder gets its own pytest process: once vLLM's Triton utilities are imported (as the patch tests do),
    the kernel tests' Triton CPU interpreter fails on nested kernels, so tests/kernels must not share a process."""
    package = package.resolve()
    env = {**os.environ, **dict(setup.env),
           "PYTHONPATH": os.pathsep.join(filter(None, [str(package.parent), *map(str, setup.path),
                                                       os.environ.get("PYTHONPATH")]))}
    _check_package(package, env)
    folders: dict[str, list[str]] = {}
    for name in files:
        folders.setdefault(str(Path(name).parent) if setup.by_folder else "", []).append(name)
    with tempfile.TemporaryDirectory(prefix="rigstack-reach-") as scratch:
        if reach:
            (Path(scratch) / "reach.json").write_text(json.dumps(sorted(reach)))
            env[REACH_ENV] = str(Path(scratch) / "reach.json")
        return _merged([_run_pytest(package, group, markers, env, setup) for group in folders.values()])


def _merged(runs: list[SuiteRun]) -> SuiteRun:
    return SuiteRun(outcomes={k: v for run in runs for k, v in run.outcomes.items()},
                    guards=frozenset().union(*(run.guards for run in runs)),
                    broken_files=frozenset().union(*(run.broken_files for run in runs)),
                    reasons={k: v for run in runs for k, v in run.reasons.items()},
                    kinds={k: v for run in runs for k, v in run.kinds.items()},
                    deselected=frozenset().union(*(run.deselected for run in runs)),
                    reached={k: v for run in runs for k, v in run.reached.items()})


def _run_pytest(package: Path, files: list[str], markers: str, env: dict[str, str], setup: PytestSetup) -> SuiteRun:
    with tempfile.TemporaryDirectory(prefix="rigstack-patchtests-") as scratch:
        report, deselected = Path(scratch) / "junit.xml", Path(scratch) / "deselected.json"
        # A baseline often cannot even import a patch's new module: keep going past collection errors.
        # The plugin writes how each failing test failed into the report (a missing module or a failed assertion).
        done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", OUTCOMES_PLUGIN,
                               "--continue-on-collection-errors", "-m", markers, f"--junitxml={report}",
                               f"{DESELECTED_OPTION}={deselected}",
                               *setup.args, *files],
                              env=env, cwd=setup.cwd, capture_output=True, text=True)
        if not report.is_file() and done.returncode < 0 and setup.split_on_crash:
            if len(files) > 1:
                return _merged([_run_pytest(package, [name], markers, env, setup) for name in files])
            return SuiteRun(outcomes={}, guards=frozenset(), broken_files=frozenset(files),
                            reasons={files[0]: _crash_reason(done.returncode, done.stdout + done.stderr)})
        if not report.is_file():
            tail = (done.stdout + done.stderr).strip().splitlines()[-5:]
            raise UserError(f"pytest wrote no report for {package} (exit {done.returncode}): {' | '.join(tail)}")
        run = parse_junit(report.read_text(), files)
        return replace(run, deselected=frozenset(json.loads(deselected.read_text()))) if deselected.is_file() else run


def _crash_reason(returncode: int, output: str) -> str:
    """'pytest died of SIGABRT in test_x (tests/y.py:12)': faulthandler's innermost frame in a test file."""
    try:
        name = signal.Signals(-returncode).name
    except ValueError:
        name = f"signal {-returncode}"
    frames = re.findall(r'File "[^"]*/(tests/[^"]+\.py)", line (\d+) in (\w+)', output)
    return f"pytest died of {name}" + (f" in {frames[0][2]} ({frames[0][0]}:{frames[0][1]})" if frames else "")


def parse_junit(xml: str, files: list[str]) -> SuiteRun:
    """Outcomes keyed by pytest node id ("tests/patches/test_x.py::test_y[a]"), from a JUnit report."""
    modules = {name[: -len(".py")].replace("/", "."): name for name in files}
    outcomes: dict[str, str] = {}
    guards: set[str] = set()
    broken: set[str] = set()
    reasons: dict[str, str] = {}
    kinds: dict[str, str] = {}
    reached: dict[str, frozenset[str]] = {}
    for case in ElementTree.fromstring(xml).iter("testcase"):
        address = ".".join(filter(None, [case.get("classname"), case.get("name")]))
        module = next((m for m in modules if address == m or address.startswith(m + ".")), None)
        if module is None:
            continue
        file = modules[module]
        verdict = next((child for child in case if child.tag in ("skipped", "failure", "error")), None)
        test_id = file if address == module else f"{file}::{address[len(module) + 1:]}"
        if verdict is not None:
            # A collection error's message is just "collection failure": its last traceback line says what failed.
            lines = (verdict.text or "").strip().splitlines()
            reasons[test_id] = (lines[-1] if address == module and lines else None) or verdict.get("message") or ""
        if address == module:  # the file itself: a collection (import) error
            broken.add(file)
            continue
        if verdict is None:
            outcomes[test_id] = PASSED
        else:
            outcomes[test_id] = SKIPPED if verdict.tag == "skipped" else FAILED
        properties = [(prop.get("name"), prop.get("value") or "") for prop in case.iter("property")]
        if any(name == GUARD for name, _ in properties):
            guards.add(test_id)
        failures = [json.loads(value) for name, value in properties if name == PROPERTY]
        if failures:  # the first failure is the one that stopped the test (a teardown's may follow)
            kinds[test_id] = failures[0]["kind"]
            reached[test_id] = frozenset(failures[0].get("reached", ()))
    return SuiteRun(outcomes=outcomes, guards=frozenset(guards), broken_files=frozenset(broken), reasons=reasons,
                    kinds=kinds, reached=reached)


def judge(patch_id: str, files: tuple[str, ...], patched: SuiteRun, baseline: SuiteRun,
          changes: frozenset[str] = frozenset(), pinned: str | None = None, against: str = PRISTINE) -> PatchProof:
    """Compare one patch's tests across the patched run and the run on its baseline (`against` names it: "pristine",
    or "stack to 0016"). A test that failed on the baseline proves the patch's behaviour only where it ran a function
    of a file the patch changes (`changes`: baseline files, relative to the package) and its own assertion failed
    there or the package raised; one that could not run there (the patch's new module, file or fixture is missing)
    proves only that the patch adds them, which an `assert True` beside a new fixture would. `pinned`: the verdict
    the patch's Proof: header expects ("": it has none, a problem; None: nothing pinned, the verdict is only
    reported)."""
    there = proofbaselines.phrase(against)
    ids = sorted(test_id for test_id in patched.outcomes if test_id.split("::")[0] in files)
    problems: list[str] = [f"Tests: names {file}, which does not exist" for file in files
                           if not (REPO_ROOT / file).is_file()]
    problems += [f"{file} does not import on the patched package" for file in files if file in patched.broken_files]
    ran = [test_id for test_id in ids if patched.outcomes[test_id] != SKIPPED]
    guards = [test_id for test_id in ran if test_id in patched.guards]
    passed = [test_id for test_id in ran if patched.outcomes[test_id] == PASSED]
    problems += [f"{test_id} fails on the patched package" for test_id in ran if test_id not in passed]
    proving = [test_id for test_id in passed if test_id not in guards]
    failed_there = [test_id for test_id in proving if baseline.outcome(test_id) == FAILED]
    problems += [f"{test_id} {'passes' if baseline.outcome(test_id) == PASSED else 'did not run'} on {there}, so "
                 "it proves nothing (mark it upstream_guard if it checks kept behaviour)"
                 for test_id in proving if test_id not in failed_there]
    problems += [f"guard {test_id} fails on {there}: it does not check kept behaviour"
                 for test_id in guards if test_id in passed and baseline.outcome(test_id) == FAILED]
    if not failed_there:
        problems.append(f"no test passes on the patched package and fails on {there}")
    behaviour = [test_id for test_id in failed_there if baseline.failure_kind(test_id) in (ASSERTION, RAISED)
                 and baseline.reached.get(test_id, frozenset()) & changes]
    proof = PatchProof(patch_id=patch_id, files=files, tests=len(ran), guards=len(guards), patched_passed=len(passed),
                       baseline_failed=len(failed_there), skipped=len(ids) - len(ran), problems=tuple(problems),
                       by_behaviour=len(behaviour), could_not_run=len(failed_there) - len(behaviour),
                       wires=bool(changes), not_run=tuple(sorted(test_id for test_id in patched.deselected
                                                                 if test_id.split("::")[0] in files)),
                       baseline=against)
    if pinned == "":
        proof = replace(proof, problems=(*proof.problems, f"its header has no Proof: line; pin the verdict its tests "
                                         f"earn: 'Proof: {proof.earned}'"))
    elif pinned is not None and pinned != proof.earned:
        proof = replace(proof, problems=(*proof.problems, f"its tests earn '{proof.earned}' but its Proof: header pins "
                                         f"'{pinned}': fix the tests, or change the header and say why"))
    return proof


def prove(stack: Stack, pristine: Path, patched: Path, only: tuple[str, ...] = (), markers: str = DEFAULT_MARKERS,
          pins: Pins | None = None, setup: PytestSetup = PytestSetup()) -> Proof:
    """Run every selected patch's tests on the patched package and on its baseline, and judge each patch. `pins`:
    what the pristine package must be (the applier checks it before building a baseline); versions.env's by default.
    """
    files_by_patch = patch_test_files(stack, only)
    # A missing file is that patch's problem (judge names it); the other patches are still proven.
    existing = {patch_id: [name for name in names if (REPO_ROOT / name).is_file()]
                for patch_id, names in files_by_patch.items()}
    files = sorted({name for names in existing.values() for name in names})
    if not files:
        raise UserError("no patch names an existing test file in its Tests: header; nothing to prove")
    check_package_folder(pristine)
    check_package_folder(patched)
    bases = proofbaselines.baselines(stack, pristine, files_by_patch, pins or load_pins())
    touched = {patch.id: patch.touched_files for patch in stack.patches}
    # The files each patch changes that its baseline has: what a test must reach to prove its behaviour.
    changes = {patch_id: frozenset(name for name in touched[patch_id] if (bases[patch_id].package / name).is_file())
               for patch_id in files_by_patch}
    patched_run = run_tests(patched, files, markers, setup)
    # One run per baseline: each patch's tests on the stack below it, watching what that patch changes.
    runs = {patch_id: run_tests(bases[patch_id].package, names, markers, setup, tuple(sorted(changes[patch_id])))
            if names else SuiteRun({}, frozenset(), frozenset()) for patch_id, names in existing.items()}
    pinned = {patch.id: patch.header.proof for patch in stack.patches}
    return Proof(pristine=pristine, patched=patched, markers=markers,
                 baselines={base.label: base.package for base in bases.values()}, patches=tuple(
                     judge(patch_id, names, patched_run, runs[patch_id], changes[patch_id], pinned[patch_id] or "",
                           bases[patch_id].label)
                     for patch_id, names in files_by_patch.items()))


def proof_json(proof: Proof) -> dict[str, object]:
    return {"pristine": str(proof.pristine), "patched": str(proof.patched), "ok": proof.ok,
            "markers": proof.markers, "baselines": {label: str(path) for label, path in proof.baselines.items()},
            "patches": [{**asdict(patch), "ok": patch.ok, "verdict": patch.verdict} for patch in proof.patches]}


def changed_since(stack: Stack, base: str, root: Path = REPO_ROOT) -> tuple[str, ...]:
    """The patches whose file or named test files differ from `base` (its merge base with HEAD) in the working
    tree of the checkout at `root`, untracked files included: what `make check` proves, where CI proves them all.
    A change to the proof's own machinery (HARNESS) proves every patch."""
    import git

    from rigstack.gitrepo import checkout_repo

    repo = checkout_repo(root)
    try:
        fork = repo.merge_base("HEAD", base)[0].hexsha
    except (git.GitCommandError, IndexError):
        raise UserError(f"no common history with {base!r}; fetch it, or prove every patch") from None
    changed = set(repo.git.diff("--name-only", fork).splitlines()) | set(repo.untracked_files)
    tests = patch_test_files(stack)
    if any(name.startswith(HARNESS) for name in changed):
        return tuple(patch.id for patch in stack.patches)
    return tuple(patch.id for patch in stack.patches
                 if str(patch.path.relative_to(root)) in changed or changed & set(tests[patch.id]))
