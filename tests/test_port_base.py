"""import --base and port --base with two real releases: a series made with real git on vLLM 0.31.0's package (a
fork's build, as a rig owner has one), `git format-patch`ed, imported against the 0.31.0 GPU wheel and ported onto
the pin (0.34.0). Both wheels' baselines come from the store port keeps in the cache (imported once, then reused)."""

from __future__ import annotations

import json
import shutil
import zipfile
from pathlib import Path

import pytest

from rigstack import port
from rigstack.baseline import sha256_of
from rigstack.wheelindex import release_wheel
from rigstack.errors import UserError
from rigstack.versions import REPO_ROOT, load_pins
from testing.cli import one_line_error, run_apply
from testing.forks import Repo, git

BASE = "0.31.0"
# Each file the series touches, and why the port must give its patch the status the test expects (checked by hand
# with `diff -u` of the two wheels' files):
# (The pin is 0.34.0; what 0.32.0 did is kept in brackets: the series was written against that pin.)
CONNECTIONS = "connections.py"  # 0.34.0 added an import (line 6) and a class (line 64) above the patch's hunk and
#   nothing inside it: the same change lower down -> refreshed (offset) [byte-identical in 0.32.0: clean]
GLM4 = "model_executor/models/glm4_moe.py"  # 0.34.0 changed lines around the patch's hunk (the fused shared
#   expert helpers, line 447), which git merges -> refreshed (merged by git) [0.32.0: one line above, offset]
MCP = "entrypoints/mcp/tool.py"  # 0.32.0 made exactly the patch's change (call_id=last_msg.call_id): -> upstreamed
LORA = "lora/request.py"  # 0.32.0 deleted the tensorizer_config_dict line the patch edits: -> conflict
FILES = (CONNECTIONS, GLM4, MCP, LORA)


@pytest.fixture(scope="module")
def base_wheel() -> Path:
    """The vllm 0.31.0 GPU wheel, downloaded once into the wheel cache beside the pinned ones."""
    try:
        wheel = release_wheel("vllm", BASE)
    except UserError as error:
        pytest.skip(f"the vllm {BASE} GPU wheel cannot be fetched, so there is no second real release: {error}")
    assert wheel is not None, f"the package index lists no vllm {BASE}"
    return wheel


def _series(wheel: Path, tmp_path: Path) -> list[Path]:
    """Four commits on a repository of 0.31.0's files (the fork layout: vllm/ at its top), format-patch'ed."""
    pristine = tmp_path / "pristine-0.31.0"
    with zipfile.ZipFile(wheel) as archive:
        archive.extractall(pristine, [f"vllm/{name}" for name in FILES])
    fork = Repo(tmp_path / "fork", pristine / "vllm", "vllm/", FILES)
    fork.edit(CONNECTIONS, "_RETRY_BACKOFF_FACTOR = 4\n", "_RETRY_BACKOFF_FACTOR = 2\n")
    fork.commit("connections: back off by 2, not 4, between retries\n\nA rig's local model server answers within "
                "seconds.")
    fork.edit(GLM4, "        if get_pp_group().is_last_rank:\n",
              "        # rigstack: only the last pipeline rank norms; the others pass hidden states on\n"
              "        if get_pp_group().is_last_rank:\n")
    fork.commit("glm4_moe: say where the final norm runs")
    fork.edit(MCP, 'call_id=f"call_{random_uuid()}",', "call_id=last_msg.call_id,")
    fork.commit("mcp: answer a python tool call with the call's own id")
    fork.edit(LORA, "    tensorizer_config_dict: dict | None = None\n",
              "    tensorizer_config_dict: dict | None = msgspec.field(default=None)\n")
    fork.commit("lora: tensorizer_config_dict as a msgspec field")
    out = tmp_path / "series"
    git(fork.root, "format-patch", "-q", "-o", str(out), "HEAD~4")
    return sorted(out.glob("*.patch"))


def test_a_series_made_on_0_31_0_imports_with_base_and_ports_onto_the_pin(base_wheel: Path, tmp_path: Path) -> None:
    pinned = load_pins().vllm_version
    series = _series(base_wheel, tmp_path)
    assert len(series) == 4
    patches = tmp_path / "patches"
    patches.mkdir()
    refused = run_apply("import", *map(str, series), "--patches", str(patches))
    assert refused.returncode == 1 and "the patch was made on another vLLM build; import it with --base" in \
        one_line_error(refused), "on the pin, the glm4_moe patch's index line names 0.31.0's blob"
    assert not any(patches.iterdir())

    imported = run_apply("import", *map(str, series), "--base", f"wheel:{BASE}", "--patches", str(patches), "--json")
    assert imported.returncode == 0, imported.stderr
    result = json.loads(imported.stdout)
    assert result["base"] == f"wheel:{BASE}" and not result["pinned"]
    assert [row["status"] for row in result["patches"]] == ["applied"] * 4
    names = [row["file"] for row in result["patches"]]
    assert [path.name for path in sorted(patches.iterdir())] == names and names[0].startswith("0001-connections")

    work = tmp_path / "build"
    stopped = run_apply("port", "--base", f"wheel:{BASE}", "--to", pinned, "--patches", str(patches), "--json",
                        "--work", str(work))
    assert stopped.returncode == 1
    report = json.loads(stopped.stdout)
    assert [p["status"] for p in report["patches"]] == ["refreshed", "refreshed", "upstreamed", "conflict"]
    offset, refreshed, upstreamed, conflict = report["patches"]
    assert offset["detail"] == "same change at other lines (offset)"
    assert refreshed["detail"] == "hunks changed (merged by git)"
    assert "already holds the change" in upstreamed["detail"]
    assert [site["file"] for site in conflict["conflicts"]] == [f"vllm/{LORA}"]
    assert f"patch {names[3]} conflicts with vLLM {pinned}" in one_line_error(stopped)
    assert report["old"]["version"] == BASE and report["old"]["source"] == f"wheel:{BASE}"
    assert report["old"]["sha256"] == sha256_of(base_wheel) and report["old"]["wheel"] == base_wheel.name
    assert report["new"]["version"] == pinned and report["new"]["sha256"] == load_pins().vllm_wheel_sha256
    assert (work / f"port-{BASE}-to-{pinned}" / "port.json").is_file()

    versions = tmp_path / "versions.env"
    shutil.copy(REPO_ROOT / "versions.env", versions)
    run = {"patches_dir": patches, "work_root": work, "versions_file": versions}
    done = port.port("skip", load_pins(), **run)
    assert [entry.status for entry in done.state.patches] == ["refreshed", "refreshed", "upstreamed", "dropped"]
    assert done.state.cpu["status"] == "no-release", done.state.cpu  # the pin's CPU flavour is the twin
    refreshed_before = (patches / names[1]).read_text()
    written = port.port("write", load_pins(versions), **run)
    assert written.state.status == "written" and written.state.notes == []
    assert sorted(path.name for path in patches.iterdir()) == [
        *names[:2], names[2].replace(".patch", ".upstreamed"), names[3].replace(".patch", ".dropped")]
    refreshed_after = (patches / names[1]).read_text()
    assert "@@ -449,6 +449,7 @@" in refreshed_before and refreshed_after != refreshed_before
    assert load_pins(versions) == load_pins(), "onto the pin: every pin stays"


def test_base_refusals_are_one_line_and_cost_nothing(base_wheel: Path, tmp_path: Path) -> None:
    work = ("--work", str(tmp_path / "build"))
    pinned = load_pins().vllm_version
    cases = [
        (("--base", f"wheel:{pinned}", "--to", pinned), f"--base wheel:{pinned} is vLLM {pinned} already"),
        (("--base", f"wheel:{BASE}", "--base-sha256", "0" * 64, "--to", pinned),
         f"sha256 {sha256_of(base_wheel)} does not match --base-sha256 {'0' * 64}"),
        (("--base", "wheel:latest", "--to", pinned),
         "--base 'wheel:latest' is not a source; use wheel, wheel:cpu, wheel:X.Y.Z, image:REF or dir:PATH"),
        (("--base", "image:my-fork", "--to", pinned), "name the image by a tag holding its vLLM version"),
        (("--base", f"dir:{tmp_path}", "--to", pinned), "names no vLLM version (no _version.py)"),
        (("--continue", "--base", f"wheel:{BASE}"), "--base is given when starting a port"),
    ]
    for args, message in cases:
        result = run_apply("port", *args, *work)
        assert result.returncode == 1 and message in one_line_error(result), (args, result.stderr)
    assert not (tmp_path / "build").exists() or not any((tmp_path / "build").iterdir())
