"""The applier's words for a patch that does not fit the pinned baseline exactly (issue 11 item 30)."""

from __future__ import annotations

from pathlib import Path

from rigstack import applier
from rigstack.baseline import parse_source
from rigstack.stack import load_stack
from testing.patches import PatchMaker

SCHED = "v1/core/sched/scheduler.py"


def _check(package: Path, folder: Path, pins) -> applier.StackResult:  # noqa: ANN001
    return applier.apply_stack(parse_source(f"dir:{package}"), load_stack(folder), pins, dry_run=True)


def test_offsets_count_hunks_and_name_the_file(cpu_package: Path, patch_maker: PatchMaker, tmp_path: Path,
                                               pins) -> None:
    """"hunk 1 by -49, ... and 2 more lines" meant 2 more hunks."""
    folder = tmp_path / "patches"
    text = patch_maker.read(SCHED)
    patch_maker.write(folder, "0001-shift.patch", {SCHED: "# one\n# two\n" + text})
    lines = text.splitlines(keepends=True)
    for number in (200, 400, 600, 800, 1000):  # five hunks, far enough apart to stay five
        lines[number] = lines[number] + "# rigstack: note\n"
    patch_maker.write(folder, "0002-notes.patch", {SCHED: "".join(lines)})
    result = _check(cpu_package, folder, pins)
    assert result.patches[1].status == "offset"
    assert result.patches[1].detail == (f"needs refresh: vllm/{SCHED}: hunk 1 by +2 lines, hunk 2 by +2 lines, "
                                        "hunk 3 by +2 lines and 2 more hunks")


def test_a_fuzz_failure_on_the_pin_advises_a_refresh_not_a_port(cpu_package: Path, patch_maker: PatchMaker,
                                                                 tmp_path: Path, pins) -> None:
    """`apply.py port` is for a new upstream; a patch that needs fuzz on the pin was made against other source."""
    folder = tmp_path / "patches"
    text = patch_maker.read(SCHED)
    other = text.replace("import time\n", "import time  # other source\n", 1)
    anchor = "from collections.abc import Iterable\n"  # two lines below: the edited line is the hunk's first context
    patch_maker.write(folder, "0001-fuzzy.patch", {SCHED: other.replace(anchor, anchor + "# rigstack\n", 1)},
                      on_top_of={SCHED: other})
    result = _check(cpu_package, folder, pins)
    assert result.patches[0].status == "fuzz", result.patches[0].detail
    assert "Refresh the patch against the pinned vLLM (patches/README.md says how)" in result.error
    assert "apply.py port" not in result.error


def test_a_conflict_whose_lines_are_mostly_in_the_pin_looks_upstreamed(cpu_package: Path, patch_maker: PatchMaker,
                                                                       tmp_path: Path, pins) -> None:
    """Issue 11 item 28: a patch made against a vLLM without _should_log_with_scope, which adds it worded a little
    otherwise: a conflict on 0.32.0, which has the function, but one that says it looks upstreamed."""
    folder = tmp_path / "patches"
    text = patch_maker.read("logger.py")
    start, end = text.index("def _should_log_with_scope("), text.index("class _VllmLogger(")
    other = text[:start] + "# other source\n" + text[end:]  # the hunk's nearest context: not even fuzz applies
    worded = text[start:end].replace("Decide whether to log based on scope.", "Whether to log in this scope.")
    patch_maker.write(folder, "0001-log-scope.patch", {"logger.py": text[:start] + worded + other[start:]},
                      on_top_of={"logger.py": other})
    result = _check(cpu_package, folder, pins)
    assert result.patches[0].status == "conflict"
    assert result.patches[0].detail == ("hunk 1 of vllm/logger.py (line 138) does not apply, but it looks upstreamed: "
                                        "8 of the 9 lines it adds (88%) are in the baseline (drop it if the baseline "
                                        "does what it does)")
    plain = tmp_path / "plain"
    patch_maker.write(plain, "0001-log-scope.patch", {"logger.py": text[:start] + worded.replace(
        "first_rank", "leader") + other[start:]}, on_top_of={"logger.py": other})
    assert "upstreamed" not in _check(cpu_package, plain, pins).patches[0].detail
