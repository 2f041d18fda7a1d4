"""Host GPUs vs the profile, device order, idleness: each fed a GPU scan that is wrong in one way."""

from __future__ import annotations

import pytest
from testing.preflight import NO_GPU, assert_status, cmp, context

from rigstack.preflight import hardware, nvml
from rigstack.preflight.core import Status
from rigstack.profiles import load_profile

PP8 = load_profile("cmp170hx-8x-pp8")


def test_the_rig_it_was_written_for_fits() -> None:
    assert_status(hardware.fit(PP8, cmp()), Status.PASS, "8 x NVIDIA CMP 170HX (64 GiB), driver 610.43.02")


@pytest.mark.parametrize(("scan", "words"), [
    (NO_GPU, ["needs 8 GPU(s), none found: no NVIDIA driver answered"]),
    (cmp(count=6), ["needs 8 GPU(s) matching 'CMP 170HX', found 6"]),
    (cmp(name="NVIDIA L40"), ["found 0 (host has: NVIDIA L40)"]),
    (cmp(memory_gib=7.8), ["GPU 0 has 7.8 GiB, the profile needs 59.6 per card"]),
])
def test_gpu_mismatches_fail(scan: nvml.GpuScan, words: list[str]) -> None:
    assert_status(hardware.fit(PP8, scan), Status.FAIL, *words)


def test_old_driver_fails(tmp_path) -> None:  # noqa: ANN001
    path = tmp_path / "rig.yaml"
    path.write_text("extends: cmp170hx-8x-pp8\nhardware:\n  driver_min: '615.0'\n")
    assert_status(hardware.fit(load_profile(path), cmp()), Status.FAIL, "driver 610.43.02 is older than 615.0")


def test_l40_pattern_does_not_take_l40s() -> None:
    l40 = load_profile("l40-8x-tp8")
    assert_status(hardware.fit(l40, cmp(name="NVIDIA L40S", memory_gib=44.4)), Status.FAIL, "found 0")
    assert_status(hardware.fit(l40, cmp(name="NVIDIA L40", memory_gib=44.4)), Status.PASS)


def test_cpu_profile_passes_with_or_without_gpus() -> None:
    cpu = load_profile("cpu-tiny")
    assert_status(hardware.fit(cpu, NO_GPU), Status.PASS, "cpu profile, needs no GPU (no NVIDIA driver")
    assert_status(hardware.fit(cpu, cmp()), Status.PASS, "8 GPU(s) present")


def test_subset_needs_pci_bus_order(tmp_path) -> None:  # noqa: ANN001
    path = tmp_path / "rig.yaml"
    path.write_text("extends: cmp170hx-6x-pp6\nenv:\n  CUDA_DEVICE_ORDER: null\n")
    six = load_profile(path)
    assert_status(hardware.device_order(context(six, gpus=cmp(count=8))), Status.FAIL, "uses 6 of 8 GPU(s)")
    fixed = context(six, gpus=cmp(count=8), environ={"CUDA_DEVICE_ORDER": "PCI_BUS_ID"})
    assert_status(hardware.device_order(fixed), Status.PASS)
    assert_status(hardware.device_order(context(six, gpus=cmp(count=6))), Status.PASS, "harmless")
    assert hardware.device_order(context("cpu-tiny")).status is Status.SKIP


def test_busy_gpu_fails() -> None:
    busy = cmp(used_gib=30.0, processes=1)
    assert_status(hardware.gpus_idle(context(PP8, gpus=busy)), Status.FAIL, "GPU 0 is busy: 1 process(es), 30.0 GiB")
    assert_status(hardware.gpus_idle(context(PP8, gpus=cmp())), Status.PASS, "8 GPU(s) idle")


def test_card_that_lost_lanes_warns() -> None:
    scan = cmp()
    narrow = nvml.GpuScan((*scan.gpus[:3], nvml.Gpu(3, "NVIDIA CMP 170HX", 63.9, 0.3, 0, "0000:03:00.0", 1),
                           *scan.gpus[4:]), driver=scan.driver)
    assert_status(hardware.link(context(PP8, gpus=narrow)), Status.WARN,
                  "GPU 3 (0000:03:00.0) runs PCIe x1, the profile expects x4 (pcie-gen2-x4)")
    assert_status(hardware.link(context(PP8, gpus=cmp())), Status.PASS, "8 GPU(s) at x4 or wider")
    assert hardware.link(context(PP8, gpus=cmp(link_width=None))).status is Status.SKIP
    assert hardware.link(context("l40-8x-tp8", gpus=cmp())).status is Status.SKIP  # a VM link names no lanes


def test_nvml_scan_reports_why_there_is_no_gpu() -> None:
    scan = nvml.scan()
    if scan.gpus:
        pytest.skip("this host has GPUs; test_nvml_scan_lists_gpus covers it")
    assert scan.problem


@pytest.mark.gpu
def test_nvml_scan_lists_gpus() -> None:
    scan = nvml.scan()
    if not scan.gpus:
        pytest.skip(f"no GPU: {scan.problem}")
    assert scan.driver and all(gpu.memory_gib > 1 and gpu.name for gpu in scan.gpus)
    assert [gpu.index for gpu in scan.gpus] == list(range(len(scan.gpus)))
    assert all(gpu.link_width is None or gpu.link_width >= 1 for gpu in scan.gpus)
