"""The fidelity gate on real vLLM CPU servers (3 boots): pristine vs patched must pass, and a planted logit
perturbation (fixtures/perturb-logits.patch, applied on top of the stack in a private copy) must fail it.

Package folders (each holds vllm/) come from RIGSTACK_PRISTINE_VLLM and RIGSTACK_PATCHED_VLLM when CI sets them;
otherwise pristine is this venv's vllm and patched is a private copy patched with `apply.py apply --from dir:`.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from rigstack.client import Server
from rigstack.endpoint import Endpoint
from rigstack.probes.bang import run_bang
from rigstack.probes.compare import EXIT_REGRESSION
from rigstack.probes.fidelity import gate
from rigstack.probes.results import Result, write_result
from rigstack.stamp import read_stamp
from testing.probes import ROOT, last_line, pristine_site, probe_server, run_script, site_from_env

pytestmark = pytest.mark.server

FIXTURE = Path(__file__).with_name("fixtures") / "perturb-logits.patch"
PROMPTS = ["The quick brown fox", "def parse(line):", "Once upon a time in a server room, the fans"]
MAX_TOKENS = 48


def _patched_copy(source: Path, site: Path, patches: Path) -> Path:
    shutil.copytree(source, site / "vllm", symlinks=True)
    applied = subprocess.run([sys.executable, str(ROOT / "apply.py"), "apply", "--from", f"dir:{site / 'vllm'}",
                              "--patches", str(patches)], capture_output=True, text=True, cwd=ROOT)
    assert applied.returncode == 0, f"apply.py failed on {patches}:\n{applied.stdout}{applied.stderr}"
    return site


@pytest.fixture(scope="module")
def sites(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    pristine = pristine_site()
    stamp = read_stamp(pristine / "vllm")  # a baseline made by `apply.py --until 0000` carries an empty stack
    assert stamp is None or not stamp.patches, f"{pristine}/vllm is patched; point RIGSTACK_PRISTINE_VLLM at an " \
                                               "unpatched copy"
    work = tmp_path_factory.mktemp("fidelity")
    patched = site_from_env("RIGSTACK_PATCHED_VLLM") or _patched_copy(pristine / "vllm", work / "patched",
                                                                      ROOT / "patches")
    # The planted corruption rides on top of the whole stack, as a bad patch would.
    stack = work / "stack-plus-fixture"
    stack.mkdir()
    for patch in (ROOT / "patches").glob("*.patch"):
        shutil.copy(patch, stack)
    shutil.copy(FIXTURE, stack / "9001-perturb-logits.patch")
    perturbed = _patched_copy(pristine / "vllm", work / "perturbed", stack)
    # Pristine boots last: test_probe_scripts asks for the very same server and reuses it.
    return {"patched": patched, "perturbed": perturbed, "pristine": pristine}


@pytest.fixture(scope="module")
def results(sites: dict[str, Path], vllm_server, tmp_path_factory: pytest.TempPathFactory) -> dict:
    out = tmp_path_factory.mktemp("fidelity-results")
    found: dict[str, tuple[Result, Path]] = {}
    for name, site in sites.items():  # one server at a time: the fixture stops the previous one
        running = probe_server(vllm_server, site)
        server = Server(Endpoint(running.url, running.model))
        result = run_bang(server, PROMPTS, MAX_TOKENS, 2, None, 0.01, None, site / "vllm")
        write_result(result, out / name)
        found[name] = (result, out / f"{name}.json")
    return found


def test_pristine_repeats_itself_to_the_bit(results: dict) -> None:
    pristine, _ = results["pristine"]
    assert pristine.metrics["clean"].value == 1.0
    assert gate(pristine, pristine).spread == 0.0


def test_patched_stack_passes(results: dict, sites: dict) -> None:
    pristine, patched = results["pristine"][0], results["patched"][0]
    verdict = gate(pristine, patched)
    assert verdict.passed, verdict.summary()
    assert verdict.tokens_compared == 2 * len(PROMPTS) * MAX_TOKENS
    # Provenance carries the stack hash from the patched package's stamp.
    stamp = read_stamp(sites["patched"] / "vllm")
    assert stamp is not None and patched.provenance.stack_hash == stamp.stack_hash
    assert not pristine.provenance.patches  # unstamped, or stamped with the empty stack by `--until 0000`


def test_planted_perturbation_fails(results: dict) -> None:
    verdict = gate(results["pristine"][0], results["perturbed"][0])
    assert not verdict.passed
    # Slight: far below a nat, far above the floor.
    assert 1e-5 < verdict.max_logprob_diff < 0.1, verdict.summary()
    assert any("logprob differs by" in problem or "tokens differ" in problem for problem in verdict.problems)


def test_compare_cli_gates_on_fidelity(results: dict) -> None:
    pristine, patched, perturbed = (results[name][1] for name in ("pristine", "patched", "perturbed"))
    assert run_script("compare.py", str(pristine), str(patched)).returncode == 0
    failed = run_script("compare.py", str(pristine), str(perturbed))
    assert failed.returncode == EXIT_REGRESSION
    assert "fidelity FAIL" in last_line(failed) and "fidelity: prompt 0" in last_line(failed)
