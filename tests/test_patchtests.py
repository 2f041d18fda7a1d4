"""rigstack.patchtests' verdicts (issue 26 items 2 and 3): a test proves a patch's behaviour only where its own
assertion failed on the pristine package; one that could not run there (a missing module, file or fixture) proves
only that the patch adds them; tests the markers leave out are listed, never dropped. Real pytest runs over two
small vllm packages, one with the "patch" (a changed constant, a new module and a data file) and one without."""

from __future__ import annotations

import io
import textwrap
from pathlib import Path

import pytest
from rich.console import Console

from rigstack import patchtests
from rigstack.output.proofs import print_proof
from rigstack.patchtests import FAILED, PASSED, PatchProof, Proof, PytestSetup, SuiteRun
from rigstack.outcomekinds import ASSERTION, COULD_NOT_RUN, RAISED

TESTS = "tests/test_kinds.py"
BROKEN = "tests/test_broken.py"


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
                      from pathlib import Path

                      import pytest
                      import vllm

                      def test_value():  # behaviour: the patch changes an existing module's value
                          assert vllm.VALUE == 2

                      def test_checks():  # behaviour: pristine does not raise, pytest.raises fails the test
                          with pytest.raises(ValueError):
                              vllm.check(-1)

                      def test_new_module():  # could not run: the new module is missing
                          from vllm import added
                          assert added.X == 1

                      def test_new_file():  # could not run: the data file is missing
                          assert (Path(vllm.__file__).parent / "table.txt").read_text() == "1"

                      def test_fixture(added):  # could not run: its fixture fails in setup (an `assert True`)
                          assert True

                      def test_crash():  # raised: the code under test raises where the patch fixed it
                          assert vllm.half(3) == 1

                      def test_new_name():  # could not run: a function the patch adds to an existing module
                          assert vllm.added_function() == 1

                      @pytest.mark.server
                      def test_served():  # left out by the markers
                          assert vllm.VALUE == 2
                      """,
                  BROKEN: "from vllm.added import X\n\ndef test_x():\n    assert X == 1\n"})
    pristine, patched = root / "pristine" / "vllm", root / "patched" / "vllm"
    _write(pristine.parent, {"vllm/__init__.py": """\
        VALUE = 1
        def check(x):
            return x
        def half(x):
            return {2: 1}[x]
        """})
    _write(patched.parent, {"vllm/__init__.py": """\
        VALUE = 2
        def check(x):
            if x < 0:
                raise ValueError(x)
            return x
        def half(x):
            return x // 2
        def added_function():
            return 1
        """, "vllm/added.py": "X = 1\n", "vllm/table.txt": "1"})
    return root, pristine, patched


@pytest.fixture(scope="module")
def runs(packages: tuple[Path, Path, Path]) -> tuple[Path, SuiteRun, SuiteRun]:
    """(tests tree, the pristine run, the patched run)."""
    root, pristine, patched = packages
    setup = PytestSetup(cwd=root, by_folder=False)
    return root, *(patchtests.run_tests(package, [TESTS, BROKEN], "not server", setup) for package in (pristine,
                                                                                                        patched))


def test_pristine_failures_are_sorted_by_how_they_failed(runs: tuple[Path, SuiteRun, SuiteRun]) -> None:
    _, run, patched = runs
    assert set(patched.outcomes.values()) == {PASSED}
    kinds = {test_id.split("::")[-1]: run.failure_kind(test_id) for test_id, outcome in run.outcomes.items()
             if outcome == FAILED}
    assert kinds == {"test_value": ASSERTION, "test_checks": ASSERTION, "test_new_module": COULD_NOT_RUN,
                     "test_new_file": COULD_NOT_RUN, "test_fixture": COULD_NOT_RUN, "test_crash": RAISED,
                     "test_new_name": COULD_NOT_RUN}
    assert run.broken_files == {BROKEN} and run.failure_kind(f"{BROKEN}::test_x") == COULD_NOT_RUN
    assert run.deselected == {f"{TESTS}::test_served"}


def test_a_patch_is_proven_by_behaviour_only_through_a_failed_assertion(runs: tuple[Path, SuiteRun, SuiteRun],
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    root, pristine, patched = runs
    monkeypatch.setattr(patchtests, "REPO_ROOT", root)  # where judge looks for the Tests: files
    both = patchtests.judge("0001", (TESTS, BROKEN), patched, pristine, wires=True)
    assert both.ok and (both.by_behaviour, both.could_not_run) == (3, 5)  # value, checks, crash
    assert both.verdict == "proven by behaviour"
    assert both.not_run == (f"{TESTS}::test_served",)
    # The same patch proven only by the file whose tests cannot run on the pristine package: additive, said so.
    additive = patchtests.judge("0001", (BROKEN,), patched, pristine, wires=True)
    assert additive.ok and (additive.by_behaviour, additive.could_not_run) == (0, 1)
    assert additive.verdict == "additive: wiring unproven"
    assert patchtests.judge("0001", (BROKEN,), patched, pristine, wires=False).verdict == "additive: new files only"


def test_the_table_says_the_verdict_and_lists_what_was_not_run() -> None:
    proven = PatchProof("0002", ("t.py",), 3, 0, 3, 3, 0, (), by_behaviour=1, could_not_run=2,
                        not_run=("tests/patches/test_e2e_pp.py::test_pp",))
    additive = PatchProof("0008", ("k.py",), 2, 0, 2, 2, 0, (), by_behaviour=0, could_not_run=2, wires=True)
    out = io.StringIO()
    print_proof(Proof(Path("/p"), Path("/q"), (proven, additive)), Console(file=out, width=250))
    shown = out.getvalue()
    assert "proven by behaviour" in shown and "additive: wiring unproven" in shown
    assert ("0002: not proven here (deselected by -m 'not server': server tests; CI runs them in the suite, on the "
            "patched package; --markers '' runs them here too): tests/patches/test_e2e_pp.py::test_pp") in shown
    assert patchtests.proof_json(Proof(Path("/p"), Path("/q"), (additive,)))["patches"][0]["verdict"] == (
        "additive: wiring unproven")
