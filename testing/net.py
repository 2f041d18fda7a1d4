"""Ports for servers the tests start.

A port the kernel picks (bind to port 0) is free only until the next outgoing connection or `bind(0)` on the box
takes it, and a booting vLLM binds several such ports of its own (its engine and distributed set-up), so a server
told to listen on a kernel-picked port could find it taken a minute later (a landing CI lost the fidelity gate to
that). So ports come from below the kernel's ephemeral range, which nothing takes unasked; each xdist worker draws
from its own slice of it, and one process never hands out the same port twice.
"""

from __future__ import annotations

import os
import random
import socket
from pathlib import Path

FIRST = 20_000  # below: well-known services, and Ray's worker ports (10,002-19,999 by default)
_EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")
_given: set[int] = set()


def _ephemeral_low() -> int:
    try:
        return int(_EPHEMERAL_RANGE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32_768  # Linux's default


def _slice() -> range:
    """This process's share of [FIRST, ephemeral low): one slice per xdist worker."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw")
    count = max(int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")), 1)
    index = int(worker) % count if worker.isdigit() else 0
    width = (_ephemeral_low() - FIRST) // count
    return range(FIRST + index * width, FIRST + (index + 1) * width)


def _bindable(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now and that the kernel will not hand out by itself."""
    ports = _slice()
    if len(ports) < 100:  # an ephemeral range that starts low leaves no room below it: the kernel's pick
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            return sock.getsockname()[1]
    for port in random.sample(ports, min(len(ports), 500)):
        if port not in _given and _bindable(port):
            _given.add(port)
            return port
    raise RuntimeError(f"no free port in {ports.start}-{ports.stop - 1} after 500 tries")
