"""Two hosts on one machine: network namespaces joined by a veth pair, the Ray head in one and a worker in the
other, started by rigstack.multinode with `ip netns exec` in place of ssh. The cluster forms across them; vLLM's
CPU platform then refuses the Ray executor (vllm/v1/executor/ray_utils.py: its ray_device_key is empty), which
this test pins down so that a vLLM that lifts the refusal shows up here. Ray is ended by process group, never
`ray stop`, and the namespaces are always removed."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from rigstack import multinode
from rigstack.serving import process, ready, runrecord
from rigstack.preflight import scale
from rigstack.preflight.core import Context, Status
from rigstack.preflight.host import meminfo
from rigstack.profiles import Host, load_profile
from testing.net import free_port
from testing.server import server_env

pytestmark = pytest.mark.usefixtures("memory_hungry")  # testing/serial.py: not beside the fleet

HEAD, WORKER = "10.77.0.1", "10.77.0.2"  # cpu-tiny-2hosts-pp2's addresses
NEED_GIB = 5.0
REFUSAL = "current platform cpu does not support ray"


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, timeout=30)


@pytest.fixture
def namespaces() -> Iterator[dict[str, str]]:
    if os.geteuid() != 0 or shutil.which("ip") is None:
        pytest.skip("needs root and iproute2 for network namespaces")
    if meminfo().get("MemAvailable", 0.0) < NEED_GIB:
        pytest.skip(f"needs {NEED_GIB:g} GiB RAM available")
    tag = f"{os.getpid() % 100000}"
    head, worker = f"rsa{tag}", f"rsb{tag}"
    try:
        _ip("netns", "add", head)
        _ip("netns", "add", worker)
        _ip("link", "add", f"{head}v", "type", "veth", "peer", "name", f"{worker}v")
        # The test reaches the head's server through a second pair, from this namespace.
        _ip("link", "add", f"{head}r", "type", "veth", "peer", "name", f"{head}h")
        for ns, link, address in ((head, f"{head}v", HEAD), (worker, f"{worker}v", WORKER),
                                  (head, f"{head}h", "10.78.0.2")):
            _ip("link", "set", link, "netns", ns)
            _ip("-n", ns, "addr", "add", f"{address}/24", "dev", link)
            _ip("-n", ns, "link", "set", link, "up")
            _ip("-n", ns, "link", "set", "lo", "up")
        _ip("addr", "add", "10.78.0.1/24", "dev", f"{head}r")
        _ip("link", "set", f"{head}r", "up")
        yield {HEAD: head, WORKER: worker}
    finally:
        subprocess.run(["ip", "link", "del", f"{head}r"], capture_output=True, timeout=30, check=False)
        for ns in (head, worker):
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=30, check=False)


@pytest.mark.server
def test_ray_across_two_namespaces_and_vllm_cpus_refusal(namespaces: dict[str, str], tmp_path: Path,
                                                        tiny_model: Path) -> None:
    port = free_port()
    profile_path = tmp_path / "two-hosts.yaml"
    profile_path.write_text(f"extends: cpu-tiny-2hosts-pp2\nhost: 0.0.0.0\nport: {port}\nhealth_timeout_s: 600\n")
    profile = load_profile(profile_path)
    temp = {address: Path(f"/tmp/rs-{ns}") for address, ns in namespaces.items()}  # short: socket paths

    def remote(host: Host, argv: list[str]) -> list[str]:
        return ["ip", "netns", "exec", namespaces[host.address], "env", f"RAY_TMPDIR={temp[host.address]}", *argv]

    facts = multinode.host_facts(profile, remote, sys.executable)
    multinode.compare_facts(profile, facts)
    assert facts[HEAD]["stack_hash"] and facts[HEAD]["ray"] == "2.60.0"
    run_dir = tmp_path / "run"
    records = multinode.start_ray(profile, remote, run_dir, python=sys.executable,
                                  ray=str(Path(sys.executable).parent / "ray"))
    try:
        assert multinode._alive_nodes(profile, remote, sys.executable) == 2
        serve = multinode.plan(profile, model=tiny_model, python=sys.executable)[-1]
        env = {**server_env(tmp_path), **serve.env}
        with pytest.raises(ready.ServerDied) as died:
            ready.launch(remote(serve.host, multinode._with_env(serve.argv, env)), {}, run_dir,
                          url=f"http://10.78.0.2:{port}", served_name="tiny", timeout_s=600)
        log = (run_dir / runrecord.LOG_NAME).read_text()
        assert REFUSAL in log and "initialize_ray_cluster" in log, died.value.tail
    finally:
        for record in reversed(records):
            process.end(record, grace_s=10)
    assert all(process.running(run_dir / f"ray-{address}") is None for address in namespaces)
    for folder in temp.values():  # every Ray process of ours runs with its temp folder on its command line
        assert subprocess.run(["pgrep", "-f", str(folder)], capture_output=True, check=False).returncode == 1
    for folder in temp.values():
        shutil.rmtree(folder, ignore_errors=True)


@pytest.mark.slow
def test_preflight_hosts_check_sees_a_closed_ray_port(namespaces: dict[str, str], monkeypatch: pytest.MonkeyPatch,
                                                      tmp_path: Path) -> None:
    """Preflight's hosts check over the two namespaces: the same stack on both and every fixed Ray port reachable,
    then one port of the worker rejected by its firewall, which the check names (no Ray is started)."""
    if shutil.which("iptables") is None:
        pytest.skip("needs iptables to close a port")
    monkeypatch.setattr(scale, "REMOTE", lambda host, argv: ["ip", "netns", "exec", namespaces[host.address], *argv])
    ctx = Context(profile=load_profile("cpu-tiny-2hosts-pp2"), model=None, package=None, python=sys.executable)
    result = scale.hosts(ctx)
    assert result.status is Status.PASS, result
    port = ctx.profile.ray.object_manager_port
    rule = ["INPUT", "-p", "tcp", "--dport", str(port), "-j", "REJECT"]
    subprocess.run(["ip", "netns", "exec", namespaces[WORKER], "iptables", "-A", *rule], check=True, timeout=30)
    result = scale.hosts(ctx)
    assert result.status is Status.FAIL and f"{HEAD} -> {WORKER}:{port}" in result.reason, result
