"""rigstack.multinode without a cluster: the hosts: shape, the per-host commands, and the errors a bad host list or
a mismatched stack gets before anything starts (the real cluster is tests/test_multinode_netns.py)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from rigstack import multinode
from rigstack.errors import UserError
from rigstack.versions import load_pins
from rigstack.profiles import Host, load_profile

ROOT = Path(__file__).resolve().parent.parent


def _error(tmp_path: Path, text: str) -> str:
    path = tmp_path / "hosts.yaml"
    path.write_text(text)
    with pytest.raises(UserError) as caught:
        load_profile(path)
    return str(caught.value)


def test_the_example_layouts_hold_their_stages() -> None:
    pp16, pp10 = load_profile("glm53-cmp170hx-2x8-pp16"), load_profile("glm53-cmp170hx-2x5-pp10")
    assert [host.gpus for host in pp16.hosts] == [8, 8] and pp16.parallel.pp == 16
    assert sum(pp16.parallel.partition) == pp16.model.shape.num_hidden_layers
    assert [host.gpus for host in pp10.hosts] == [5, 5] and pp10.parallel.pp == 10
    assert pp16.gpus_needed == 8 and pp10.gpus_needed == 5  # the head's share is what this host must have


@pytest.mark.parametrize(("text", "expected"), [
    ("hosts: [{address: 10.0.0.1, gpus: 1}, {address: 10.0.0.1, gpus: 1}]\n", "10.0.0.1 is listed twice"),
    ("hosts: [{address: 10.0.0.1, gpus: 1}, {address: 10.0.0.2, gpus: 2}]\n",
     "the hosts hold 3 GPU(s) but tp 1 x pp 2 needs 2"),
    ("hosts: [{address: 10.0.0.1, gpus: 2}]\n", "one host needs no Ray cluster"),
    ("hosts: [{address: 10.0.0.1, gpus: 1}, {address: 10.0.0.2, gpus: 1}]\nparallel: {replicas: 2}\n",
     "replicas and router do not combine with hosts:"),
])
def test_bad_host_lists_fail_at_load(tmp_path: Path, text: str, expected: str) -> None:
    message = _error(tmp_path, "extends: cpu-tiny-pp2\n" + text)
    assert expected in message and "hosts.yaml:" in message


def test_the_plan_starts_the_head_then_workers_then_serves_on_ray() -> None:
    profile = load_profile("glm53-cmp170hx-2x8-pp16")
    head, worker, serve = multinode.plan(profile, model=Path("/m"), python="/venv/bin/python", ray="/venv/bin/ray")
    assert (head.host.address, head.what, worker.host.address, serve.host.address) == (
        "10.0.0.11", "ray head", "10.0.0.12", "10.0.0.11")
    assert head.argv[:4] == ["/venv/bin/ray", "start", "--block", "--head"]
    assert head.argv[head.argv.index("--num-gpus") + 1] == "8" and "--port" in head.argv
    assert worker.argv[worker.argv.index("--address") + 1] == "10.0.0.11:6379"
    assert worker.argv[worker.argv.index("--node-ip-address") + 1] == "10.0.0.12"
    assert worker.env["VLLM_HOST_IP"] == "10.0.0.12" and serve.env["VLLM_HOST_IP"] == "10.0.0.11"
    assert serve.argv[-2:] == ["--distributed-executor-backend", "ray"]
    assert serve.argv[serve.argv.index("--pipeline-parallel-size") + 1] == "16"
    layout = load_profile("glm53-cmp170hx-2x8-pp16").parallel.partition
    assert serve.env["VLLM_PP_LAYER_PARTITION"] == ",".join(map(str, layout))


def test_dry_run_prints_each_hosts_command_over_ssh() -> None:
    done = subprocess.run([sys.executable, "scripts/run_prod.py", "--profile", "glm53-cmp170hx-2x5-pp10",
                           "--model", "/m", "--dry-run"], cwd=ROOT, capture_output=True, text=True, timeout=120,
                          check=False)
    assert done.returncode == 0, done.stderr
    blocks = done.stdout.strip().split("\n\n")
    whose = f"(python {sys.executable}: the launch's own, as the profile names none for this host)"
    assert [block.splitlines()[0] for block in blocks] == [
        f"# on 10.0.0.11: ray head {whose}", f"# on 10.0.0.12: ray worker {whose}",
        f"# on 10.0.0.11: vllm serve {whose}"]
    assert all(block.splitlines()[1] == "ssh \\" and "-o BatchMode=yes 10.0.0.1" in block for block in blocks)
    assert all("-o ConnectTimeout=10" in block for block in blocks)  # an unreachable host fails in seconds
    assert "--distributed-executor-backend ray" in blocks[2] and "VLLM_HOST_IP=10.0.0.12" in blocks[1]


def test_each_host_runs_the_python_the_profile_names_for_it(tmp_path: Path) -> None:
    """Issue 29 item 12: a host's python: in hosts: is the interpreter (and the ray beside it) its commands run, and
    the dry run says where each came from (before: the launch's own python and ray on every host, silently)."""
    profile = tmp_path / "hosts.yaml"
    profile.write_text("extends: cpu-tiny-2hosts-pp2\nhosts:\n  - {address: 10.77.0.1, gpus: 1, "
                       "python: /a/bin/python}\n  - {address: 10.77.0.2, gpus: 1}\n")
    done = subprocess.run([sys.executable, "scripts/run_prod.py", "--profile", str(profile), "--model", "/m",
                           "--dry-run"], cwd=ROOT, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    head, worker, serve = done.stdout.strip().split("\n\n")
    assert head.splitlines()[0] == ("# on 10.77.0.1: ray head (python /a/bin/python: the profile's python: for this "
                                    "host)")
    assert serve.splitlines()[0].startswith("# on 10.77.0.1: vllm serve (python /a/bin/python: the profile's")
    assert worker.splitlines()[0] == (f"# on 10.77.0.2: ray worker (python {sys.executable}: the launch's own, as the "
                                      "profile names none for this host)")
    assert "/a/bin/ray start --block --head" in head and "/a/bin/python -m vllm.entrypoints" in serve
    assert f"{Path(sys.executable).parent / 'ray'} start --block --address 10.77.0.1:" in worker
    assert "/a/bin" not in worker


def test_a_worker_with_another_stack_is_refused() -> None:
    profile = load_profile("cpu-tiny-2hosts-pp2")
    same = {"vllm": "0.34.0+cpu", "ray": "2.60.0", "stack_hash": "sha256:aa"}
    multinode.compare_facts(profile, {"10.77.0.1": same, "10.77.0.2": dict(same)})
    with pytest.raises(UserError, match=r"host 10.77.0.2: stack_hash is sha256:bb, the head 10.77.0.1 has "
                                        r"sha256:aa; install the same stack"):
        multinode.compare_facts(profile, {"10.77.0.1": same, "10.77.0.2": {**same, "stack_hash": "sha256:bb"}})
    with pytest.raises(UserError, match="ray is 2.59.0"):
        multinode.compare_facts(profile, {"10.77.0.1": same, "10.77.0.2": {**same, "ray": "2.59.0"}})


def test_the_version_probe_reads_this_venv() -> None:
    """The probe each host runs, run here: it names the vllm and ray it imports and the package's stack hash."""
    facts = multinode.host_facts(load_profile("cpu-tiny-2hosts-pp2"), lambda host, argv: argv, sys.executable)
    mine = facts["10.77.0.1"]
    assert mine == facts["10.77.0.2"] and mine["vllm"].startswith(load_pins().vllm_version) and mine["ray"] == "2.60.0"


def test_an_unreachable_host_is_named() -> None:
    def remote(host: Host, argv: list[str]) -> list[str]:
        return [sys.executable, "-c", "import sys; sys.exit('ssh: connect to host: No route to host')"]

    with pytest.raises(UserError, match=r"host 10.77.0.1: the version probe failed \(exit 1: ssh: connect to host"):
        multinode.host_facts(load_profile("cpu-tiny-2hosts-pp2"), remote, sys.executable)
