"""rigstack.patchtests' verdicts (issue 26 items 2 and 3, issue 37 item 1): a test proves a patch's behaviour only
where, on its baseline, it ran a function of a file the patch changes and then its own assertion failed or the
package raised; one that could not run there (a missing module, file, name, key or fixture) or never reached the
changed code proves only that the patch adds something; tests the markers leave out are listed, never dropped. Real
pytest runs over two small vllm packages, one with the "patch" (changed functions, a registry key, a new module and
a data file) and one without; and over a two-patch stack, where the second patch's baseline is the first applied
(rigstack.proofbaselines, built by the applier into a cache of the test's own)."""

from __future__ import annotations

import io
import os
import shutil
import textwrap
import time
from dataclasses import replace
from pathlib import Path

import pytest
from rich.console import Console

from rigstack import patchtests, proofbaselines
from rigstack.baseline import DirSource, fingerprint
from rigstack.errors import UserError
from rigstack.output.proofs import print_proof
from rigstack.patchtests import FAILED, PASSED, PatchProof, Proof, PytestSetup, SuiteRun
from rigstack.outcomekinds import ASSERTION, COULD_NOT_RUN, RAISED
from rigstack.stack import load_stack
from rigstack.versions import Pins, load_pins
from testing.patches import PatchMaker

TESTS = "tests/test_kinds.py"
BROKEN = "tests/test_broken.py"
CHANGED = "__init__.py"  # the one pristine file the fake patch changes, relative to the package


def _write(root: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(textwrap.dedent(text))


@pytest.fixture(scope="module")
def packages(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path]:
    """(tests tree, pristine vllm, patched vllm)."""
    root = tmp_path_factory.mktemp("kinds")
    _write(root, {"pyproject.toml": "[tool.pytest.ini_options]\nmarkers = ['server: boots a server']\n",
                  "tests/__init__.py": "",
                  "tests/conftest.py": """\
                      import pytest

                      @pytest.fixture
                      def added():  # a fixture over the patch's new module: fails in setup where it is missing
                          from vllm import added
                          return added
                      """,
                  TESTS: """\
                      import multiprocessing
                      import os
                      import queue
                      import subprocess
                      import sys
                      from pathlib import Path

                      import pytest
                      import vllm

                      def test_value():  # behaviour: a function of the changed module runs, then the assert fails
                          assert vllm.scaled(1) == 2

                      def test_checks():  # behaviour: pristine does not raise, pytest.raises fails the test
                          with pytest.raises(ValueError):
                              vllm.check(-1)

                      def test_crash():  # behaviour: the package's own code raises where the patch fixed it
                          assert vllm.half(3) == 1

                      def test_child():  # behaviour: a new interpreter runs the changed function, the parent asserts
                          done = subprocess.run([sys.executable, "-c", "import vllm; print(vllm.scaled(1))"],
                                                capture_output=True, text=True)
                          assert done.stdout.strip() == "2"

                      def _scaled_in_child(answers):
                          answers.put(vllm.scaled(1))

                      def test_spawned_child():  # behaviour: the same through multiprocessing's spawn (0011's ranks)
                          context = multiprocessing.get_context("spawn")
                          answers = context.Queue()
                          child = context.Process(target=_scaled_in_child, args=(answers,))
                          child.start()
                          answer = answers.get(timeout=60)
                          child.join(timeout=60)
                          assert answer == 2

                      def test_constant():  # not reached: a constant read, no function of the module ran
                          assert vllm.VALUE == 2

                      def test_child_data_half_written():  # a child's data file half written: read as no data
                          folder = os.environ.get("RIGSTACK_PROOF_CHILD_DATA")
                          if folder:
                              (Path(folder) / "child.partial").write_text("half")
                          assert vllm.VALUE == 2

                      def test_new_module():  # could not run: the new module is missing
                          from vllm import added
                          assert added.X == 1

                      def test_new_file():  # could not run: the data file is missing
                          assert (Path(vllm.__file__).parent / "table.txt").read_text() == "1"

                      def test_fixture(added):  # could not run: its fixture fails in setup (an `assert True`)
                          assert True

                      def test_new_name():  # could not run: a function the patch adds to an existing module
                          assert vllm.added_function() == 1

                      # Issue 37 item 1: five ways of failing only because a name is missing.
                      def test_child_cannot_import():  # a child dies on the import; the parent asserts its code
                          done = subprocess.run([sys.executable, "-c", "import vllm.added"], capture_output=True)
                          assert done.returncode == 0

                      def test_hasattr():
                          assert hasattr(vllm, "added_function")

                      def test_getattr_default():
                          added_function = getattr(vllm, "added_function", None)
                          assert added_function is not None and added_function() == 1

                      def test_import_fallback():
                          try:
                              from vllm.added import X
                          except ImportError:
                              X = None
                          assert X == 1

                      def test_registry_key():  # the package's lookup of a key the patch registers
                          assert vllm.lookup("new") == 2

                      def test_test_code_raises():  # the test's own code raises (a queue a dead child never filled)
                          answers = queue.Queue()
                          if hasattr(vllm, "added_function"):
                              answers.put(vllm.added_function())
                          assert answers.get(timeout=0.01) == 1

                      @pytest.mark.server
                      def test_served():  # left out by the markers
                          assert vllm.VALUE == 2
                      """,
                  BROKEN: "from vllm.added import X\n\ndef test_x():\n    assert X == 1\n"})
    pristine, patched = root / "pristine" / "vllm", root / "patched" / "vllm"
    _write(pristine.parent, {"vllm/__init__.py": """\
        VALUE = 1
        REGISTRY = {"old": 1}
        def scaled(x):
            return x * VALUE
        def check(x):
            return x
        def half(x):
            return x // (x - 3)
        def lookup(name):
            return REGISTRY[name]
        """})
    _write(patched.parent, {"vllm/__init__.py": """\
        VALUE = 2
        REGISTRY = {"old": 1, "new": 2}
        def scaled(x):
            return x * VALUE
        def check(x):
            if x < 0:
                raise ValueError(x)
            return x
        def half(x):
            return x // 2
        def lookup(name):
            return REGISTRY[name]
        def added_function():
            return 1
        """, "vllm/added.py": "X = 1\n", "vllm/table.txt": "1"})
    return root, pristine, patched


@pytest.fixture(scope="module")
def runs(packages: tuple[Path, Path, Path]) -> tuple[Path, SuiteRun, SuiteRun]:
    """(tests tree, the pristine run, the patched run); the pristine run watches the changed module."""
    root, pristine, patched = packages
    setup = PytestSetup(cwd=root, by_folder=False)
    return (root, patchtests.run_tests(pristine, [TESTS, BROKEN], "not server", setup, reach=(CHANGED,)),
            patchtests.run_tests(patched, [TESTS, BROKEN], "not server", setup))


BEHAVIOUR_TESTS = {"test_value", "test_checks", "test_crash", "test_child", "test_spawned_child"}
NOT_REACHED = {"test_constant", "test_child_data_half_written", "test_child_cannot_import", "test_hasattr",
               "test_getattr_default", "test_import_fallback"}
MISSING = {"test_new_module", "test_new_file", "test_fixture", "test_new_name", "test_registry_key",
           "test_test_code_raises"}


def test_pristine_failures_are_sorted_by_how_they_failed(runs: tuple[Path, SuiteRun, SuiteRun]) -> None:
    _, run, patched = runs
    assert set(patched.outcomes.values()) == {PASSED}
    failed = {test_id.split("::")[-1]: test_id for test_id, outcome in run.outcomes.items() if outcome == FAILED}
    assert set(failed) == BEHAVIOUR_TESTS | NOT_REACHED | MISSING
    kinds = {name: run.failure_kind(test_id) for name, test_id in failed.items()}
    assert kinds == {"test_value": ASSERTION, "test_checks": ASSERTION, "test_crash": RAISED, "test_child": ASSERTION,
                     "test_spawned_child": ASSERTION, **dict.fromkeys(NOT_REACHED, ASSERTION),
                     **dict.fromkeys(MISSING, COULD_NOT_RUN)}
    # Reach: only the tests that called a function of the changed module ran its code, in their own process or in a
    # child they started (a child that only imports the package runs none of its functions).
    assert {name for name, test_id in failed.items() if run.reached.get(test_id)} == BEHAVIOUR_TESTS | {
        "test_registry_key"}
    assert run.broken_files == {BROKEN} and run.failure_kind(f"{BROKEN}::test_x") == COULD_NOT_RUN
    assert run.deselected == {f"{TESTS}::test_served"}


def test_a_failure_with_no_recorded_kind_could_not_run() -> None:
    """A test whose process died before the plugin wrote its verdict proves nothing by default."""
    run = SuiteRun(outcomes={"t.py::test_x": FAILED}, guards=frozenset(), broken_files=frozenset())
    assert run.failure_kind("t.py::test_x") == COULD_NOT_RUN


def test_a_patch_is_proven_by_behaviour_only_where_its_changed_code_ran(runs: tuple[Path, SuiteRun, SuiteRun],
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    root, pristine, patched = runs
    monkeypatch.setattr(patchtests, "REPO_ROOT", root)  # where judge looks for the Tests: files
    changes = frozenset({CHANGED})
    both = patchtests.judge("0001", (TESTS, BROKEN), patched, pristine, changes)
    assert both.ok and (both.by_behaviour, both.could_not_run) == (5, 13)  # value, checks, crash and the children
    assert both.verdict == "proven by behaviour"
    assert both.not_run == (f"{TESTS}::test_served",)
    # The same failures against a patch that changes another file: nothing reached it, so nothing proves behaviour.
    elsewhere = patchtests.judge("0001", (TESTS,), patched, pristine, frozenset({"other.py"}))
    assert elsewhere.ok and elsewhere.by_behaviour == 0 and elsewhere.verdict == "additive: wiring unproven"
    # Proven only by the file whose tests cannot run on the pristine package: additive, said so.
    additive = patchtests.judge("0001", (BROKEN,), patched, pristine, changes)
    assert additive.ok and (additive.by_behaviour, additive.could_not_run) == (0, 1)
    assert additive.verdict == "additive: wiring unproven"
    assert patchtests.judge("0001", (BROKEN,), patched, pristine).verdict == "additive: new files only"


def test_a_pinned_verdict_that_moves_is_a_problem(runs: tuple[Path, SuiteRun, SuiteRun],
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    root, pristine, patched = runs
    monkeypatch.setattr(patchtests, "REPO_ROOT", root)
    changes = frozenset({CHANGED})
    assert patchtests.judge("0001", (TESTS,), patched, pristine, changes, pinned="proven by behaviour").ok
    slid = patchtests.judge("0001", (BROKEN,), patched, pristine, changes, pinned="proven by behaviour")
    assert slid.verdict == "NOT PROVEN"
    assert slid.problems == ("its tests earn 'additive: wiring unproven' but its Proof: header pins 'proven by "
                             "behaviour': fix the tests, or change the header and say why",)
    unpinned = patchtests.judge("0001", (TESTS,), patched, pristine, changes, pinned="")
    assert unpinned.problems == ("its header has no Proof: line; pin the verdict its tests earn: 'Proof: proven by "
                                 "behaviour'",)


def test_the_table_says_the_verdict_and_lists_what_was_not_run() -> None:
    proven = PatchProof("0002", ("t.py",), 3, 0, 3, 3, 0, (), by_behaviour=1, could_not_run=2,
                        not_run=("tests/patches/test_e2e_pp.py::test_pp",), baseline="stack to 0001")
    additive = PatchProof("0008", ("k.py",), 2, 0, 2, 2, 0, (), by_behaviour=0, could_not_run=2, wires=True)
    out = io.StringIO()
    print_proof(Proof(Path("/p"), Path("/q"), (proven, additive)), Console(file=out, width=250))
    shown = out.getvalue()
    assert "proven by behaviour" in shown and "additive: wiring unproven" in shown and "stack to 0001" in shown
    assert ("0002: not proven here (deselected by -m 'not server': server tests; CI runs them in the suite, on the "
            "patched package; --markers '' runs them here too): tests/patches/test_e2e_pp.py::test_pp") in shown
    assert patchtests.proof_json(Proof(Path("/p"), Path("/q"), (additive,)))["patches"][0]["verdict"] == (
        "additive: wiring unproven")


# Issue 37 item 1: each patch is judged against the stack below it, built by the applier and kept in the cache.
STACKED_TESTS = {"0001": "tests/test_0001.py", "0002": "tests/test_0002.py"}


@pytest.fixture(scope="module")
def stacked(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path, Pins]:
    """(tests tree with patches/, pristine vllm, patched vllm, pins the fake pristine package matches). 0001 doubles
    `scale` and adds vllm/added.py; 0002 changes added.py, and one of its tests checks 0001's `scale` instead."""
    root = tmp_path_factory.mktemp("stacked")
    _write(root, {"tests/__init__.py": "", STACKED_TESTS["0001"]: """\
                      import vllm

                      def test_scale():
                          assert vllm.scale(1) == 2
                      """, STACKED_TESTS["0002"]: """\
                      import vllm

                      def test_value():  # 0002's own behaviour, in the file 0001 added
                          from vllm.added import value
                          assert value() == 2

                      def test_scale():  # 0001's behaviour: passes on the stack below 0002
                          assert vllm.scale(1) == 2
                      """})
    pristine = root / "pristine" / "vllm"
    _write(pristine.parent, {"vllm/__init__.py": "def scale(x):\n    return x\n"})
    first = {"__init__.py": "def scale(x):\n    return x * 2\n", "added.py": "def value():\n    return 1\n"}
    second = {"added.py": "def value():\n    return 2\n"}
    scratch = tmp_path_factory.mktemp("scratch") / "vllm"
    shutil.copytree(pristine, scratch)
    maker = PatchMaker(scratch)
    for patch_id, diff in (("0001", maker.diff(first)), ("0002", maker.diff(second, on_top_of=first))):
        header = (f"Subject: patch {patch_id}\nWhy: a test\nOrigin: rigstack tests\nUpstream: not submitted\n"
                  f"Switch: none (bug fix)\nRigs: all\nTests: {STACKED_TESTS[patch_id]}\nProof: proven by behaviour\n")
        _write(root, {f"patches/{patch_id}-step.patch": header + "---\n" + diff})
    patched = root / "patched" / "vllm"
    shutil.copytree(pristine, patched)
    _write(patched, {**first, **second})
    return root, pristine, patched, replace(load_pins(), vllm_fingerprint_cpu=fingerprint(pristine))


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A cache of the test's own: the baselines are built there, never in the real one."""
    monkeypatch.setenv("RIGSTACK_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache" / proofbaselines.FOLDER


def test_a_test_an_earlier_patch_satisfies_proves_nothing(stacked: tuple[Path, Path, Path, Pins], cache: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    root, pristine, patched, pins = stacked
    monkeypatch.setattr(patchtests, "REPO_ROOT", root)
    setup = PytestSetup(cwd=root, by_folder=False)
    proof = patchtests.prove(load_stack(root / "patches"), pristine, patched, pins=pins, setup=setup)
    first, second = proof.patches
    assert (first.baseline, second.baseline) == ("pristine", "stack to 0001")
    assert first.ok and first.verdict == "proven by behaviour"
    assert second.problems == ("tests/test_0002.py::test_scale passes on the stack below it (to 0001), so it "
                               "proves nothing (mark it upstream_guard if it checks kept behaviour)",)
    # test_value reached added.py, which 0002 changes and its baseline has (pristine has not): behaviour.
    assert (second.baseline_failed, second.by_behaviour) == (1, 1)
    assert proof.baselines["stack to 0001"].parent.parent == cache
    # Against the pristine package, as the proof judged before, 0002 passed: both tests fail there, neither by
    # behaviour (added.py is new there), so it looked additive and nothing caught 0001's test.
    files = [STACKED_TESTS["0002"]]
    old = patchtests.judge("0002", tuple(files), patchtests.run_tests(patched, files, "not server", setup),
                           patchtests.run_tests(pristine, files, "not server", setup))
    assert old.ok and old.verdict == "additive: new files only"


def test_a_baseline_is_built_once_per_stack_and_reused(stacked: tuple[Path, Path, Path, Pins], cache: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    root, pristine, _, pins = stacked
    stack = load_stack(root / "patches")
    built = proofbaselines.baselines(stack, pristine, ("0001", "0002"), pins)
    assert built["0001"] == proofbaselines.Baseline("pristine", pristine)
    below = built["0002"].package
    assert (below / "__init__.py").read_text().endswith("x * 2\n") and "return 1" in (below / "added.py").read_text()

    def no_build(*args: object, **kwargs: object) -> None:
        raise AssertionError("a baseline the cache holds was built again")

    monkeypatch.setattr(proofbaselines, "apply_stack", no_build)
    assert proofbaselines.baselines(stack, pristine, ("0002",), pins) == {"0002": built["0002"]}
    # Another 0001 is another stack below 0002: never the entry of the old one.
    monkeypatch.undo()
    monkeypatch.setenv("RIGSTACK_CACHE", str(cache.parent))
    edited = root / "edited"
    shutil.copytree(root / "patches", edited)
    first = edited / "0001-step.patch"
    first.write_text(first.read_text().replace("+    return x * 2", "+    return x * 3"))
    again = proofbaselines.baselines(load_stack(edited), pristine, ("0002",), pins)["0002"].package
    assert again != below and (again / "__init__.py").read_text().endswith("x * 3\n")


def test_a_half_built_baseline_is_never_used(stacked: tuple[Path, Path, Path, Pins], cache: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    root, pristine, _, pins = stacked
    stack = load_stack(root / "patches")

    def killed(source: DirSource, *args: object, **kwargs: object) -> None:
        (source.path / "added.py").write_text("half")
        raise UserError("killed mid-apply")

    monkeypatch.setattr(proofbaselines, "apply_stack", killed)
    with pytest.raises(UserError, match="killed mid-apply"):
        proofbaselines.baselines(stack, pristine, ("0002",), pins)
    assert list(cache.iterdir()) == []  # no entry, and its temporary is gone
    monkeypatch.undo()
    monkeypatch.setenv("RIGSTACK_CACHE", str(cache.parent))
    # A build killed outright (SIGKILL) leaves its temporary: the next proof builds its own beside it.
    leftover = cache / ".to-0001-0000000000000000.tmp-killed"
    _write(leftover, {"vllm/__init__.py": "half", "vllm/added.py": "half"})
    package = proofbaselines.baselines(stack, pristine, ("0002",), pins)["0002"].package
    assert package.parent.parent == cache and not package.parent.name.startswith(".")
    assert (package / "added.py").read_text() == "def value():\n    return 1\n"
    # and removes it once it is clearly dead (an hour unused)
    os.utime(leftover, (time.time() - 7200, time.time() - 7200))
    proofbaselines.baselines(stack, pristine, ("0002",), pins)
    assert not leftover.exists() and package.is_dir()


def test_a_pristine_package_other_than_the_pinned_one_is_named(stacked: tuple[Path, Path, Path, Pins],
                                                             cache: Path) -> None:
    root, pristine, _, _ = stacked
    with pytest.raises(UserError, match=f"^--pristine {pristine}, brought to the stack to 0001 for the proof: .* is "
                                        "not the pinned vLLM"):
        proofbaselines.baselines(load_stack(root / "patches"), pristine, ("0002",), load_pins())
    assert list(cache.iterdir()) == []
