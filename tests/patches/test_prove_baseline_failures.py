"""Every patch's tests pass on the patched package and fail on the stack below that patch (rigstack.patchtests),
every CI run.

CI sets RIGSTACK_PRISTINE_VLLM and RIGSTACK_PATCHED_VLLM to two vllm package folders (with their .so files): a
pristine copy and the copy `apply.py apply --from dir:...` patched. Each proof runs the patch tests on the patched
package and on each patch's baseline, the pristine copy with the patches below it applied (built once per stack into
the rigstack cache; slow).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from rich.console import Console

from rigstack import patchtests
from rigstack.output.proofs import print_proof
from rigstack.stack import load_stack
from rigstack.versions import REPO_ROOT

pytestmark = pytest.mark.usefixtures("cpu_hungry")  # testing/serial.py: not beside the fleet and replicas files
PRISTINE = os.environ.get("RIGSTACK_PRISTINE_VLLM")
PATCHED = os.environ.get("RIGSTACK_PATCHED_VLLM")
needs_patched = pytest.mark.skipif(not PATCHED, reason="set RIGSTACK_PATCHED_VLLM to a patched vllm package folder "
                                                       "(CI does) to prove the patch tests")


@needs_patched
@pytest.mark.timeout(3600)  # every patch's tests patched and on its baseline, on a 2-core box
@pytest.mark.skipif(not PRISTINE, reason="set RIGSTACK_PRISTINE_VLLM to a pristine vllm package folder (CI does) to "
                                         "prove the patch tests")
def test_every_patch_passes_patched_and_fails_below_it() -> None:
    only: tuple[str, ...] = ()
    if os.environ.get("RIGSTACK_PROOF_SCOPE") == "changed":  # make check: the patches changed since main
        only = patchtests.changed_since(load_stack(), "main")
        if not only:
            pytest.skip("no patch and no patch test changed since main (CI proves every patch)")
    proof = patchtests.prove(load_stack(), Path(PRISTINE), Path(PATCHED), only=only)
    print_proof(proof, Console(file=sys.stdout, width=200))
    assert proof.patches
    assert proof.ok, "; ".join(f"{p.patch_id}: {problem}" for p in proof.patches for problem in p.problems)
    # Issue 26 item 3: every server test a Tests: header names is listed as not proven here, none dropped.
    files = sorted({name for patch in proof.patches for name in patch.files})
    assert {test_id for patch in proof.patches for test_id in patch.not_run} == _server_tests(files)


def _server_tests(files: list[str]) -> set[str]:
    """The node ids marked server in these files, collected by pytest (a process per folder, as the proof runs)."""
    found: set[str] = set()
    for folder in sorted({str(Path(name).parent) for name in files}):
        done = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
                               "-m", "server", *(name for name in files if str(Path(name).parent) == folder)],
                              cwd=REPO_ROOT, capture_output=True, text=True,
                              env={**os.environ, "PYTHONPATH": str(Path(PATCHED).parent)})
        found |= {line for line in done.stdout.splitlines() if "::" in line}
    return found


@pytest.mark.slow
@needs_patched
def test_a_package_against_itself_proves_nothing() -> None:
    # The proof must be able to fail: with the patched package as the "pristine" one (0001's baseline), nothing
    # fails there.
    proof = patchtests.prove(load_stack(), Path(PATCHED), Path(PATCHED), only=("0001",))
    (patch,) = proof.patches
    assert not proof.ok
    assert patch.patched_passed > 0 and patch.baseline_failed == 0
    assert any("passes on the pristine package" in problem for problem in patch.problems)


def test_cli_names_a_folder_that_is_not_a_package(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "scripts/prove_patch_tests.py", "--pristine", str(tmp_path),
                           "--patched", str(tmp_path), "--only", "0001"],
                          cwd=REPO_ROOT, capture_output=True, text=True)
    assert done.returncode == 1
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ")
    assert f"{tmp_path} is not a vllm package folder" in lines[0]


def test_make_check_proves_the_patches_changed_since_main(tmp_path: Path) -> None:
    """make check's scope: a patch whose test file is edited, and one whose patch file is new, are chosen; others
    are not; nothing changed chooses nothing."""
    clone = tmp_path / "clone"
    subprocess.run(["git", "clone", "-q", "--local", str(REPO_ROOT), str(clone)], check=True)
    stack = load_stack(clone / "patches")
    assert patchtests.changed_since(stack, "HEAD", root=clone) == ()
    first, second = stack.patches[0], stack.patches[1]
    test_file = clone / patchtests.patch_test_files(stack)[first.id][0]
    test_file.write_text(test_file.read_text() + "\n# edited\n")
    new_patch = clone / "patches" / f"{second.id}-copy.patch"  # untracked: counts as changed
    second.path.rename(new_patch)
    assert patchtests.changed_since(load_stack(clone / "patches"), "HEAD", root=clone) == (first.id, second.id)
    # A change to the proof's own machinery can move any verdict: every patch is proven.
    (clone / "testing" / "patches.py").write_text((clone / "testing" / "patches.py").read_text() + "\n# edited\n")
    stack = load_stack(clone / "patches")
    assert patchtests.changed_since(stack, "HEAD", root=clone) == tuple(patch.id for patch in stack.patches)
