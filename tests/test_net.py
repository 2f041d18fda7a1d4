"""testing.net: test servers' ports come from outside the kernel's ephemeral range, per xdist worker, never twice."""

from __future__ import annotations

import socket

import pytest

from testing import net


def test_ports_are_below_the_ephemeral_range_and_never_repeat() -> None:
    ports = [net.free_port() for _ in range(50)]
    assert len(set(ports)) == 50
    assert all(net.FIRST <= port < net._ephemeral_low() for port in ports), ports


@pytest.mark.parametrize("worker", range(4))
def test_each_xdist_worker_has_its_own_slice(worker: int, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYTEST_XDIST_WORKER", f"gw{worker}")
    monkeypatch.setenv("PYTEST_XDIST_WORKER_COUNT", "4")
    width = (net._ephemeral_low() - net.FIRST) // 4
    assert net.FIRST + worker * width <= net.free_port() < net.FIRST + (worker + 1) * width


def test_a_port_something_listens_on_is_skipped(monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        busy = taken.getsockname()[1]
        spare = next(port for port in net._slice() if port not in net._given and net._bindable(port))
        monkeypatch.setattr(net.random, "sample", lambda population, k: [busy, spare])
        assert net.free_port() == spare
