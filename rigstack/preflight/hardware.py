"""Checks of the host's GPUs against the profile: count, name, memory, driver, device order, idleness."""

from __future__ import annotations

import re

from rigstack.preflight.core import Context, Result, check, fail, passed, skip, warn
from rigstack.invocation import command
from rigstack.preflight.nvml import Gpu, GpuScan
from rigstack.profiles import Profile

# NVML reports a little less than the marketing size (the driver reserves some); 5% covers it, not a lost unlock.
MEMORY_SLACK = 0.95
IDLE_USED_GIB = 1.0


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in re.findall(r"\d+", text))


def fit(profile: Profile, scan: GpuScan) -> Result:
    """Does this host's GPU set fit the profile? (Shared by the check and `preflight.py profiles`.)"""
    need, hw = profile.gpus_needed, profile.hardware
    if need == 0:
        found = f"{len(scan.gpus)} GPU(s) present" if scan.gpus else (scan.problem or "no GPU")
        return passed(f"cpu profile, needs no GPU ({found})")
    if not scan.gpus:
        return fail(f"needs {need} GPU(s), none found: {scan.problem or 'NVML lists no device'}",
                    f"run on the rig, or pick a cpu profile: {command('preflight --profile cpu-tiny')}")
    matching: list[Gpu] = [gpu for gpu in scan.gpus
                           if not hw.gpu_name or re.search(hw.gpu_name, gpu.name, re.IGNORECASE)]
    if len(matching) < need:
        names = ", ".join(sorted({gpu.name for gpu in scan.gpus}))
        return fail(f"needs {need} GPU(s) matching {hw.gpu_name!r}, found {len(matching)} (host has: {names})",
                    f"pick the profile for this rig: {command('preflight profiles')}")
    if hw.card_gib:
        small = [gpu for gpu in matching[:need] if gpu.memory_gib < hw.card_gib * MEMORY_SLACK]
        if small:
            gpu = small[0]
            return fail(f"GPU {gpu.index} has {gpu.memory_gib:.1f} GiB, the profile needs {hw.card_gib:.1f} per card",
                        "check the card's VRAM unlock (nvidia-smi --query-gpu=memory.total --format=csv)")
    if hw.driver_min and scan.driver and _version(scan.driver) < _version(hw.driver_min):
        return fail(f"driver {scan.driver} is older than {hw.driver_min}",
                    f"install NVIDIA driver {hw.driver_min} or newer")
    extra = f", {len(scan.gpus) - need} more idle for other work" if len(scan.gpus) > need else ""
    return passed(f"{need} x {matching[0].name} ({matching[0].memory_gib:.0f} GiB), driver {scan.driver}{extra}")


@check("gpus")
def gpus(ctx: Context) -> Result:
    if ctx.profile.gpus_needed == 0:
        return passed("cpu profile, needs no GPU")  # NVML is not even loaded: a quarter of a cpu-tiny run
    return fit(ctx.profile, ctx.gpus)


@check("device-order")
def device_order(ctx: Context) -> Result:
    """CUDA numbers cards fastest-first by default, nvidia-smi by bus: with a subset, the wrong cards get used."""
    need = ctx.profile.gpus_needed
    if need == 0:
        return skip("cpu profile")
    subset = len(ctx.gpus.gpus) > need or ctx.profile.parallel.replicas > 1
    order = ctx.env_value("CUDA_DEVICE_ORDER")
    if order == "PCI_BUS_ID":
        return passed("CUDA_DEVICE_ORDER=PCI_BUS_ID")
    if subset:
        return fail(f"the profile uses {need} of {max(len(ctx.gpus.gpus), need)} GPU(s) but CUDA_DEVICE_ORDER is "
                    f"{order or 'unset'}, so CUDA may number them differently from nvidia-smi",
                    "add CUDA_DEVICE_ORDER: PCI_BUS_ID to the profile's env")
    return passed(f"all GPUs used; CUDA_DEVICE_ORDER {order or 'unset'} is harmless")


_LANES = re.compile(r"-x(\d+)\b")


@check("link")
def link(ctx: Context) -> Result:
    """Lane count only: an idle card drops its PCIe generation to save power, but it keeps its lanes, and a card
    that retrained to x1 after a cold boot (peers' rigs) runs PP hops at a quarter of the speed."""
    lanes = _LANES.search(ctx.profile.hardware.link or "")
    need = ctx.profile.gpus_needed
    if need == 0 or not lanes or not ctx.gpus.gpus:
        return skip("no PCIe lane count to compare" if need else "cpu profile")
    want = int(lanes.group(1))
    known = [gpu for gpu in ctx.gpus.gpus[:need] if gpu.link_width is not None]
    narrow = [gpu for gpu in known if gpu.link_width < want]
    if narrow:
        gpu = narrow[0]
        return warn(f"GPU {gpu.index} ({gpu.pci_bus_id}) runs PCIe x{gpu.link_width}, the profile expects "
                    f"x{want} ({ctx.profile.hardware.link})", "reseat or retrain the card (a warm reboot often "
                    "restores the lanes); check with nvidia-smi -q -d PCIE")
    if not known:
        return skip("the driver reports no PCIe link width")
    return passed(f"{len(known)} GPU(s) at x{want} or wider")


@check("gpus-idle")
def gpus_idle(ctx: Context) -> Result:
    need = ctx.profile.gpus_needed
    if need == 0 or not ctx.gpus.gpus:
        return skip("no GPU to use" if need else "cpu profile")
    busy = [gpu for gpu in ctx.gpus.gpus[:need] if gpu.processes or gpu.used_gib > IDLE_USED_GIB]
    if busy:
        gpu = busy[0]
        return fail(f"GPU {gpu.index} is busy: {gpu.processes} process(es), {gpu.used_gib:.1f} GiB used",
                    f"stop what runs there (nvidia-smi shows it; {command('stop')} for ours)")
    return passed(f"{need} GPU(s) idle")

