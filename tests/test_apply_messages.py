"""The applier's words for a patch that does not fit the pinned baseline exactly (issue 11 item 30)."""

from __future__ import annotations

from pathlib import Path

from rigstack import applier
from rigstack.baseline import parse_source
from rigstack.stack import load_stack
from tests.conftest import PatchMaker

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
