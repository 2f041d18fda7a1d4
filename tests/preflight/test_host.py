"""Port, /dev/shm, IPC socket path and host RAM checks, each fed a profile asking for what this host does not have."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from testing.preflight import assert_status, context, profile_at

from rigstack.preflight import host
from rigstack.preflight.core import Status


def test_port_in_use_fails(tmp_path: Path) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        port = sock.getsockname()[1]
        profile = profile_at(tmp_path, f"extends: cpu-tiny\nport: {port}\n")
        assert_status(host.port(context(profile)), Status.FAIL, f"port {port} on 127.0.0.1 is in use")
    assert_status(host.port(context(profile)), Status.PASS, f"port {port} free")


def test_a_port_a_stopped_server_left_in_time_wait_is_free(tmp_path: Path) -> None:
    """Issue 39 item 10: right after a stop the server's side of its connections sits in TIME_WAIT for about a
    minute; the server binds with SO_REUSEADDR (uvicorn does) and starts, so the check must not call it in use."""
    with socket.socket() as server:
        server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn does; its TIME_WAITs inherit it
        server.bind(("127.0.0.1", 0))
        server.listen()
        port = server.getsockname()[1]
        client = socket.create_connection(("127.0.0.1", port))
        accepted, _ = server.accept()
        accepted.close()  # the server closes first: its end goes to TIME_WAIT
        client.recv(1)
        client.close()
    profile = profile_at(tmp_path, f"extends: cpu-tiny\nport: {port}\n")
    assert_status(host.port(context(profile)), Status.PASS, f"port {port} free")


def test_replicas_check_every_port(tmp_path: Path) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        port = sock.getsockname()[1]
        profile = profile_at(tmp_path, f"extends: rtxpro6000-tp2-replicas\nhost: 127.0.0.1\nport: {port - 1}\n")
        assert_status(host.port(context(profile)), Status.FAIL, f"port {port} on 127.0.0.1 is in use")


def test_small_shm_fails(tmp_path: Path) -> None:
    profile = profile_at(tmp_path, "extends: cpu-tiny\nhardware:\n  shm_gib: 100000\n")
    assert_status(host.shm(context(profile)), Status.FAIL, "/dev/shm has", "the profile wants 100000")
    assert_status(host.shm(context("cpu-tiny")), Status.PASS)


def test_host_ram(tmp_path: Path) -> None:
    offload = profile_at(tmp_path, "extends: rtxpro6000-1x-offload\noffload:\n  host_gib: 100000\n")
    assert_status(host.host_ram(context(offload)), Status.FAIL, "100000 GiB of experts are to live in host RAM")
    big = profile_at(tmp_path, "extends: cpu-tiny\nhardware:\n  host_ram_gib: 100000\n", name="big")
    assert_status(host.host_ram(context(big)), Status.WARN, "the profile was measured with 100000")
    assert_status(host.host_ram(context("cpu-tiny")), Status.PASS, "GiB RAM available")


def test_ipc_path_at_the_unix_socket_limit(tmp_path: Path) -> None:
    """The check's limit is the one zmq enforces when vLLM binds its engine socket (base + "/" + a uuid4)."""
    import uuid

    import zmq

    for extra, status in ((0, Status.PASS), (1, Status.FAIL)):
        stem = str(tmp_path / "b")
        base = Path(stem + "x" * (host.SOCKET_PATH_MAX - host.UUID_CHARS - 1 - len(stem) + extra))
        base.mkdir()
        assert_status(host.ipc_path(context("cpu-tiny", environ={"VLLM_RPC_BASE_PATH": str(base)})), status)
        with zmq.Context() as zctx, zctx.socket(zmq.PULL) as sock:
            address = f"ipc://{base}/{uuid.uuid4()}"
            if status is Status.PASS:
                sock.bind(address)
            else:
                with pytest.raises(zmq.ZMQError, match="longer than"):
                    sock.bind(address)
    assert_status(host.ipc_path(context("cpu-tiny", environ={"TMPDIR": "/tmp"})), Status.PASS, "engine sockets in /tmp")
