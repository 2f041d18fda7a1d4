"""Writing an accepted port: patches/ and the pins in versions.env."""

from __future__ import annotations

import shutil
from functools import partial
from pathlib import Path

from rigstack import treeswap
from rigstack.atomic import write_atomic
from rigstack.baseline import sha256_of
from rigstack.errors import UserError
from rigstack.port.state import PORTED, STATE, PortReport, PortState, WRITABLE, port_command
from rigstack.stack import Stack, load_stack
from rigstack.versions import TWIN, Pins, update_pins


def _write(work: Path, state: PortState, pins: Pins, versions_file: Path) -> PortReport:
    """Accept a finished port: the refreshed stack into patches/, notes for removed patches, the new pins."""
    command = partial(port_command, work.parent)
    if state.status in ("stopped", "running"):
        where = state.patches[state.next].file
        why = f"a conflict is open in {where}" if state.status == "stopped" else f"interrupted at {where}"
        raise UserError(f"the port to {state.new.version} is not finished ({why}); nothing was written. Resolve it "
                        f"and `{command('--continue')}`, or --skip / --abort")
    if state.status == "written":
        raise UserError(f"the port to {state.new.version} was already written; start another with "
                        f"`{command('--to VERSION')}`")
    if state.new.source != "wheel":
        raise UserError(f"--write pins the GPU wheel, but this port used {state.new.source}; port with "
                        f"`{command(f'--to {state.new.version} --from wheel')}` to write it")
    patches_dir = Path(state.patches_dir)
    stack = load_stack(patches_dir)
    if stack.stack_hash != state.stack_hash:
        raise UserError(f"{patches_dir} changed since the port started; nothing was written. Port again with "
                        f"`{command('--abort')}` then `{command(f'--to {state.new.version}')}`")
    assert all(entry.status in WRITABLE for entry in state.patches)
    changes = _new_pins(state, pins)  # a download: before anything is written
    own_pins = patches_dir.resolve() == (versions_file.parent / "patches").resolve()
    targets = [patches_dir, *([versions_file] if own_pins else []), work / STATE]
    try:
        _stage_stack(work, state, stack, treeswap.staged(patches_dir))
        state.status = "written"
        if own_pins:
            update_pins(changes, versions_file, into=treeswap.staged(versions_file))
        else:
            # A side folder ported onto the pin: its pins belong to whatever checkout it becomes the patches/ of.
            pins_text = " ".join(f"{key}={value}" for key, value in changes.items())
            state.notes.append(f"the pins were not written: {patches_dir} is not the patches/ beside "
                               f"{versions_file}; the versions.env of the checkout whose patches/ it becomes takes "
                               f"{pins_text}")
        write_atomic(treeswap.staged(work / STATE), state.model_dump_json(indent=2).encode())
    except BaseException:
        treeswap.discard(targets)  # nothing was swapped: the tree is as before
        raise
    treeswap.swap(targets)  # all of patches/, versions.env and the port's state, or none
    if not own_pins:
        return PortReport(str(work), state, message=f"wrote the stack to {patches_dir}; the pins for it are in the "
                                                    "notes (not written: it is not this checkout's patches/)")
    return PortReport(str(work), state, message=f"wrote the stack to {patches_dir} and the pins to {versions_file}")


def _stage_stack(work: Path, state: PortState, stack: Stack, into: Path) -> None:
    """The new patches/ in full beside the old one: the ported patches, a note for each one removed, and whatever
    else the folder holds (README, COVERAGE) as it is."""
    shutil.rmtree(into, ignore_errors=True)
    shutil.copytree(Path(state.patches_dir), into, symlinks=True)
    for patch, entry in zip(stack.patches, state.patches):
        if entry.status in ("upstreamed", "dropped"):
            why = (f"vLLM {state.new.version} already holds this change" if entry.status == "upstreamed"
                   else f"dropped with --skip while porting to vLLM {state.new.version}")
            note = (f"Removed: {why} ({entry.detail}); `apply.py port --write` removed the patch when porting "
                    f"from vLLM {state.old.version}.\nSha256: {patch.sha256}\n{patch.header_text}")
            (into / f"{patch.file.removesuffix('.patch')}.{entry.status}").write_text(note)
            (into / patch.file).unlink()
        else:
            shutil.copyfile(work / PORTED / patch.file, into / patch.file)


def _new_pins(state: PortState, pins: Pins) -> dict[str, str]:
    """versions.env's new values for the ported release (the CPU pins only when the CPU twin took the stack)."""
    image = pins.vllm_image.rsplit(":", 1)[0]
    changes = _sdist_pins(state, pins) | {
        "VLLM_VERSION": state.new.version, "VLLM_WHEEL": state.new.wheel or "",
        "VLLM_WHEEL_SHA256": state.new.sha256 or "", "VLLM_FINGERPRINT_GPU": state.new.fingerprint,
        "VLLM_IMAGE": f"{image}:v{state.new.version}", "VLLM_IMAGE_DIGEST": ""}
    if state.cpu.get("status") == "applies":
        changes |= {"VLLM_CPU_WHEEL": state.cpu["wheel"], "VLLM_CPU_WHEEL_SHA256": state.cpu["sha256"],
                    "VLLM_FINGERPRINT_CPU": state.cpu["fingerprint"]}
    elif state.cpu.get("status") == "no-release" and pins.cpu_is_twin and pins.vllm_version == state.new.version:
        pass  # a stack ported onto the pin from a --base: the pin's twin stays as it is
    elif state.cpu.get("status") == "no-release":
        # The tests' CPU flavour becomes the twin built from the new sdist (rigstack/twin.py); its wheel is built
        # here, so no sha256 can be pinned, and its fingerprint is known once it is built.
        changes |= {"VLLM_CPU_WHEEL": TWIN, "VLLM_CPU_WHEEL_SHA256": "", "VLLM_FINGERPRINT_CPU": ""}
        state.notes.append(f"vllm-cpu has no {state.new.version} release: the CPU flavour is now the twin built from "
                           "the sdist (`make cpu`); pin the VLLM_FINGERPRINT_CPU that `rigstack twin` prints after "
                           "its first build")
    else:
        state.notes.append(f"the CPU pins stay at vllm-cpu {state.old.version} ({state.cpu.get('detail', '')})")
    return changes


def _sdist_pins(state: PortState, pins: Pins) -> dict[str, str]:
    """VLLM_SDIST and its sha256 for the new release (scripts/upstream_tests.py runs vLLM's tests from it); when it
    cannot be had, a note says why and that the old pins stay (upstream_tests.py then refuses them by name)."""
    from rigstack.upstreamtests import release_sdist  # only --write needs pip's index client

    try:
        sdist = release_sdist(state.new.version)
    except UserError as error:
        state.notes.append(f"VLLM_SDIST stays {pins.vllm_sdist}: {error}; until VLLM_SDIST and VLLM_SDIST_SHA256 "
                           f"name vLLM {state.new.version}'s sdist, scripts/upstream_tests.py refuses to run")
        return {}
    return {"VLLM_SDIST": sdist.name, "VLLM_SDIST_SHA256": sha256_of(sdist)}
