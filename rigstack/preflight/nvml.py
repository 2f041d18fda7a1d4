"""The one wrapper around NVML (nvidia-ml-py): what GPUs this host has, without touching CUDA."""

from __future__ import annotations

from dataclasses import dataclass

GIB = 1024**3


@dataclass(frozen=True)
class Gpu:
    index: int  # NVML order, which is PCI bus order
    name: str
    memory_gib: float
    used_gib: float
    processes: int
    pci_bus_id: str = ""
    link_width: int | None = None  # current PCIe lanes; None where the driver does not say (some VMs)


@dataclass(frozen=True)
class GpuScan:
    gpus: tuple[Gpu, ...]
    driver: str | None = None
    problem: str | None = None  # why no GPU could be listed


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _link_width(pynvml, handle) -> int | None:  # noqa: ANN001 - the module and an NVML handle
    try:
        return int(pynvml.nvmlDeviceGetCurrPcieLinkWidth(handle))
    except pynvml.NVMLError:
        return None


def scan() -> GpuScan:
    try:
        import pynvml
    except ImportError:
        return GpuScan((), problem="nvidia-ml-py is not installed (pip install -r requirements.txt)")
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as error:
        return GpuScan((), problem=f"no NVIDIA driver answered ({error})")
    try:
        gpus = []
        for index in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            memory = pynvml.nvmlDeviceGetMemoryInfo(handle)
            gpus.append(Gpu(index=index, name=_text(pynvml.nvmlDeviceGetName(handle)),
                            memory_gib=memory.total / GIB, used_gib=memory.used / GIB,
                            processes=len(pynvml.nvmlDeviceGetComputeRunningProcesses(handle)),
                            pci_bus_id=_text(pynvml.nvmlDeviceGetPciInfo(handle).busId),
                            link_width=_link_width(pynvml, handle)))
        return GpuScan(tuple(gpus), driver=_text(pynvml.nvmlSystemGetDriverVersion()))
    except pynvml.NVMLError as error:
        return GpuScan((), problem=f"NVML failed while listing GPUs ({error})")
    finally:
        pynvml.nvmlShutdown()
