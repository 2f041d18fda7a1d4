"""README's counts and examples against the tool (issue 29): a figure the stack changes comes from the stack, and an
example runs as printed. The port row and the planner tables have their own tests (test_tool_venv.py,
test_planner_published.py)."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
import xml.etree.ElementTree as ET

from rigstack.rigimages import laid_files
from rigstack.localbase import ROOTFS_PACKAGES
from rigstack.outcomekinds import VERDICTS
from rigstack.preflight.knowledge import find_package
from rigstack.stack import load_stack
from rigstack.versions import REPO_ROOT

README = (REPO_ROOT / "README.md").read_text()


def _row(start: str) -> str:
    return next(line for line in README.splitlines() if line.startswith(start))


def test_the_apply_benchmark_row_counts_the_stack() -> None:
    row = _row("| apply: naive reproduce block / apply.py")
    assert int(re.search(r"GPU wheel and (\d+) patches", row).group(1)) == len(load_stack().patches), row


def test_the_image_row_counts_the_files_the_stack_lays() -> None:
    """The image lays what the patched package changed, plus the stamp (rigstack.rigimages.laid_files)."""
    row = _row("| `apply.py apply --from image:")
    package = find_package()
    assert package is not None, "the test venv's vllm is patched by scripts/test_env.sh"
    assert int(re.search(r"the stack lays (\d+) files now", row).group(1)) == len(laid_files(package)), row


def test_the_swap_example_runs_as_printed() -> None:
    start = README.index("python scripts/probe_bang.py swap ")
    example = README[start:README.index("\n", README.index("--dry-run", start))].replace("\\\n", " ")
    words = shlex.split(example.split("#")[0])
    assert words[:2] == ["python", "scripts/probe_bang.py"]
    done = subprocess.run([sys.executable, *words[1:]], cwd=REPO_ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and "dry run: nothing started" in done.stderr, done.stdout + done.stderr


def test_the_cpu_base_docs_name_its_compiler() -> None:
    """The local CPU base installs g++ (inductor needs it); the docker profile's comment said it had none."""
    assert "g++" in ROOTFS_PACKAGES
    for path in (REPO_ROOT / "profiles" / "cpu-tiny-docker.yaml", REPO_ROOT / "images" / "README.md"):
        text = path.read_text()
        assert "g++" in text and "no C++ compiler" not in text, path


def test_the_last_gpu_run_row_is_its_committed_result_file() -> None:
    """Issue 37 item 4: the README's last GPU run says what the junit file it names holds (counts and date)."""
    row = _row("| the GPU tier, last run")
    file = REPO_ROOT / re.search(r"`(measured/gpu/[^`]+\.xml)`", row).group(1)
    suite = ET.parse(file).getroot()
    suite = suite if suite.tag == "testsuite" else suite.find("testsuite")
    failed = int(suite.get("failures")) + int(suite.get("errors"))
    passed = int(suite.get("tests")) - failed - int(suite.get("skipped"))
    counts = re.search(r"\*\*(\d+) passed, (\d+) failed, (\d+) skipped\*\*", row).groups()
    assert tuple(map(int, counts)) == (passed, failed, int(suite.get("skipped"))), row
    date = row.split("| ")[2][:10]
    assert suite.get("timestamp", "").startswith(date) and file.parent.name.startswith(date), row


def test_the_proof_table_is_the_verdicts_the_patches_pin() -> None:
    """README's per-verdict rows list the patches whose Proof: header pins that verdict; CI's proof asserts that each
    patch's tests still earn it (tests/patches/test_prove_baseline_failures.py)."""
    pinned: dict[str, list[str]] = {verdict: [] for verdict in VERDICTS}
    for patch in load_stack().patches:
        pinned[patch.header.proof or "none"].append(patch.id)
    shown = {verdict: re.findall(r"\b\d{4}\b", _row(f"| {verdict} |")) for verdict in VERDICTS}
    assert shown == pinned
