"""Checks of the host itself: the port, /dev/shm, the IPC socket folder, RAM for offloaded experts."""

from __future__ import annotations

import errno
import os
import socket
import tempfile
from pathlib import Path

from rigstack.preflight.core import Context, Result, check, fail, passed, skip, warn
from rigstack.replicas import public_ports

GIB = 1024**3
SHM = Path("/dev/shm")
MEMINFO = Path("/proc/meminfo")


def port_in_use(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        # As the server will bind (uvicorn sets SO_REUSEADDR): a stopped server's TIME_WAIT sockets do not count.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError as error:
            return error.errno in (errno.EADDRINUSE, errno.EACCES)
    return False


@check("port")
def port(ctx: Context) -> Result:
    profile = ctx.profile
    ports = public_ports(profile)
    busy = [p for p in ports if port_in_use(profile.host, p)]
    if busy:
        return fail(f"port {busy[0]} on {profile.host} is in use",
                    f"stop what listens there (ss -ltnp 'sport = :{busy[0]}') or set port: in the profile")
    return passed(f"port{'s' if len(ports) > 1 else ''} {', '.join(map(str, ports))} free on {profile.host}")


@check("shm")
def shm(ctx: Context) -> Result:
    want = ctx.profile.hardware.shm_gib
    if not want:
        return skip("profile gives no hardware.shm_gib")
    try:
        stats = os.statvfs(SHM)
    except OSError:
        return fail(f"{SHM} is missing", "mount a tmpfs on /dev/shm (docker: --ipc=host or --shm-size)")
    free = stats.f_bavail * stats.f_frsize / GIB
    if free < want:
        return fail(f"{SHM} has {free:.1f} GiB free, the profile wants {want:g}",
                    f"remount it larger: mount -o remount,size={int(want) + 1}G /dev/shm")
    return passed(f"{SHM} {free:.1f} GiB free (>= {want:g})")


# vLLM binds its engine sockets at VLLM_RPC_BASE_PATH (default: the temp folder) + "/" + a uuid4 (36 characters);
# a Unix socket's path holds at most 107 bytes, and past that the engine dies at startup with a ZMQError.
SOCKET_PATH_MAX = 107
UUID_CHARS = 36


@check("ipc-path")
def ipc_path(ctx: Context) -> Result:
    base = ctx.env_value("VLLM_RPC_BASE_PATH") or ctx.env_value("TMPDIR") or tempfile.gettempdir()
    longest = len(os.fsencode(base)) + 1 + UUID_CHARS
    if longest > SOCKET_PATH_MAX:
        return fail(f"vLLM's engine sockets would sit in {base} ({longest} bytes with the socket's name, a Unix "
                    f"socket holds {SOCKET_PATH_MAX})",
                    "set VLLM_RPC_BASE_PATH (or TMPDIR) to a folder with a shorter path, e.g. /tmp")
    return passed(f"engine sockets in {base} ({longest} of {SOCKET_PATH_MAX} bytes)")


def meminfo() -> dict[str, float]:
    """MemTotal, MemAvailable, ... in GiB."""
    values = {}
    for line in MEMINFO.read_text().splitlines():
        key, _, rest = line.partition(":")
        parts = rest.split()
        if parts and parts[0].isdigit():
            values[key] = int(parts[0]) * 1024 / GIB
    return values


@check("host-ram")
def host_ram(ctx: Context) -> Result:
    profile = ctx.profile
    offload = profile.offload.host_gib if profile.offload else 0.0
    want = profile.hardware.host_ram_gib
    if not offload and not want:
        return skip("profile needs no host RAM figure")
    info = meminfo()
    total, available = info.get("MemTotal", 0.0), info.get("MemAvailable", 0.0)
    if offload and available < offload:
        return fail(f"{available:.0f} GiB RAM available, {offload:g} GiB of experts are to live in host RAM",
                    "free RAM, or lower offload.host_gib and cpu-offload-gb together")
    if want and total < want * 0.95:
        return warn(f"host has {total:.0f} GiB RAM, the profile was measured with {want:g}",
                    "expect less headroom; lower max-num-seqs if the server swaps")
    return passed(f"{available:.0f} of {total:.0f} GiB RAM available" + (f", {offload:g} GiB for experts" if offload
                                                                         else ""))
