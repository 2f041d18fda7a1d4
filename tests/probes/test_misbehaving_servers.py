"""Servers that refuse, fail, answer garbage or drip: every probe ends in one clear line and the right exit code,
never a traceback, a hang, or a failure read as a finding."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from rigstack.probes.bang import EXIT_CORRUPT
from rigstack.probes.cli import EXIT_FAILED
from testing.net import free_port
from testing.probes import last_line, run_script, run_script_rss

RUNS = {  # the cheapest run of each probe that still sends requests
    "bench": ("bench.py", "--workload", "code", "--fixed", "none", "--warmup", "0"),
    "conc": ("conc.py", "--levels", "1", "--requests", "2", "--fixed", "none", "--warmup", "0"),
    "needle": ("needle.py", "--lengths", "256", "--depths", "0.5"),
    "qual": ("qual.py", "--group", "arithmetic"),
    "probe_bang": ("probe_bang.py", "run", "--repeats", "2", "--max-tokens", "8"),
}


def _probe(name: str, url: str, tmp_path: Path, *extra: str, timeout: float = 120):
    script, *args = RUNS[name]
    if name == "probe_bang":
        script, args = f"{script} {args[0]}", args[1:]
    return run_script(*script.split(), "--url", url, "--model", "fake", *args, *extra, "--out", str(tmp_path / "r"),
                      timeout=timeout)


def _one_clean_line(process) -> str:  # noqa: ANN001 - a CompletedProcess
    assert "Traceback" not in process.stderr and "bug:" not in process.stderr, process.stderr
    errors = [line for line in process.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1, process.stderr
    return errors[0]


# -- item 21: a setting that cannot fit is said up front; a failed request is a failure, never corruption -------
@pytest.mark.parametrize("name", ["bench", "conc", "qual", "probe_bang"])
def test_max_tokens_beyond_the_context_is_refused_up_front(tmp_path: Path, fake_server, name: str) -> None:
    process = _probe(name, fake_server("--max-model-len", "2048"), tmp_path, "--max-tokens", "8000")
    assert process.returncode == 1
    assert _one_clean_line(process) == ("error: --max-tokens 8000 does not fit the server: its max_model_len is "
                                        "2048 and the longest prompt takes 0 tokens; pass --max-tokens 2048 or less")
    assert not list(tmp_path.iterdir())  # refused before anything ran or was written


def test_bang_default_max_tokens_on_a_small_server(tmp_path: Path, fake_server) -> None:
    """The reported case: probe_bang's default 8000 tokens against a 2,048-token server."""
    process = run_script("probe_bang.py", "run", "--url", fake_server("--max-model-len", "2048"), "--model", "fake",
                         "--out", str(tmp_path / "g"))
    assert process.returncode == 1 and "CORRUPTION" not in process.stderr
    assert "--max-tokens 8000 does not fit the server: its max_model_len is 2048" in _one_clean_line(process)


def test_failed_requests_are_not_corruption(tmp_path: Path, fake_server) -> None:
    process = _probe("probe_bang", fake_server("--ok", "0"), tmp_path)
    assert process.returncode == EXIT_FAILED != EXIT_CORRUPT
    assert "CORRUPTION" not in process.stderr + (tmp_path / "r.json").read_text()
    assert _one_clean_line(process) == ("error: 2 of the 2 runs of the probe failed (HTTP 500: engine dead (fake)); "
                                        "a failed request measures nothing (the result files list them)")
    assert "note: NOT JUDGED: every request failed (HTTP 500: engine dead (fake))" in last_line(process)


def test_needle_says_when_no_length_fits(tmp_path: Path, fake_server) -> None:
    url = fake_server("--max-model-len", "2048")
    process = run_script("needle.py", "--url", url, "--model", "fake", "--lengths", "4096,16384",
                         "--out", str(tmp_path / "n"))
    assert process.returncode == 1 and not list(tmp_path.iterdir())
    assert _one_clean_line(process) == ("error: no --lengths fit the server: its max_model_len is 2048 and each cell "
                                        "needs its length plus 24 answer tokens; pass --lengths up to 2024")
    process = run_script("needle.py", "--url", url, "--model", "fake", "--lengths", "256,4096", "--depths", "0",
                         "--out", str(tmp_path / "n"))
    assert process.returncode == 0, process.stderr
    assert "note: lengths 4096 skipped: they do not fit the server's max_model_len 2048" in last_line(process)


# -- item 22: every request failed is not a success ---------------------------------------------------------------
@pytest.mark.parametrize("name, group", [("bench", "workload code"), ("conc", "c1"), ("qual", "the quality items"),
                                         ("needle", "the needle grid")])
def test_every_request_failed_exits_non_zero(tmp_path: Path, fake_server, name: str, group: str) -> None:
    process = _probe(name, fake_server("--ok", "0"), tmp_path)
    assert process.returncode == EXIT_FAILED
    assert _one_clean_line(process).startswith(f"error: every request of {group} failed (HTTP 500: engine dead "
                                               "(fake)); a failed request measures nothing")
    assert (tmp_path / "r.json").is_file()  # the result is still written: it says what failed


# -- item 23: garbage is a clear error, a dripping server meets the deadline -------------------------------------
@pytest.mark.parametrize("body, message", [
    ("<html>502 Bad Gateway</html>", "the answer is not JSON (Expecting value)"),
    ("[]", "the answer is JSON list, not an object: '[]'"),
    ('{"data": 5}', '"data" is not a list of model cards'),
])
def test_a_bad_model_list(tmp_path: Path, fake_server, body: str, message: str) -> None:
    process = _probe("bench", fake_server("--models", body), tmp_path)
    assert process.returncode == 1
    line = _one_clean_line(process)
    assert line.startswith("error: http://127.0.0.1:") and message in line


@pytest.mark.parametrize("name", sorted(RUNS))
def test_an_empty_model_list_on_every_probe(tmp_path: Path, fake_server, name: str) -> None:
    process = _probe(name, fake_server("--models", "[]"), tmp_path)
    assert process.returncode == 1 and "is JSON list, not an object" in _one_clean_line(process)


@pytest.mark.parametrize("chunk, message", [
    ("[1, 2]", "malformed reply from the server: a stream chunk is JSON list, not an object: '[1, 2]'"),
    ("7", "malformed reply from the server: a stream chunk is JSON int, not an object"),
    ("{oops", "malformed reply from the server: a stream chunk is not JSON"),
    ('{"choices": [{"delta": {"content": 5}}]}', "malformed reply from the server: a field of the wrong type"),
    ('{"choices": ["x"]}', "malformed reply from the server: a field of the wrong type"),
    ('{"choices": [], "usage": {"completion_tokens": "many"}}',
     "malformed reply from the server: usage.completion_tokens is 'many', not a token count"),
    ('{"choices": [{"delta": {"tool_calls": [{"index": 1000000000}]}}]}',
     "malformed reply from the server: tool call index 1000000000 after 0 calls"),
])
def test_a_malformed_stream_is_a_failed_request(tmp_path: Path, fake_server, chunk: str, message: str) -> None:
    process = _probe("conc", fake_server("--chunk", chunk), tmp_path)
    assert process.returncode == EXIT_FAILED
    assert message in _one_clean_line(process)


@pytest.mark.parametrize("reply, message", [
    ("[]", "malformed reply from the server: the reply is JSON list, not an object: '[]'"),
    ("Internal error", "malformed reply from the server: the reply is not JSON (Expecting value): 'Internal error'"),
    ('{"choices": [{"text": "x", "logprobs": {"tokens": ["token_id:1"], "token_logprobs": ["low"]}}]}',
     "malformed reply from the server: a field of the wrong type (ValueError"),
])
def test_a_malformed_answer_is_a_failed_request(tmp_path: Path, fake_server, reply: str, message: str) -> None:
    process = _probe("probe_bang", fake_server("--reply", reply), tmp_path)
    assert process.returncode == EXIT_FAILED and "CORRUPTION" not in process.stderr
    assert message in _one_clean_line(process)


@pytest.mark.parametrize("name", ["bench", "conc", "probe_bang"])
def test_a_dripping_server_meets_the_deadline(tmp_path: Path, fake_server, name: str) -> None:
    """One byte every 0.3 s never trips httpx's per-read timeout; --timeout is a deadline for the whole answer."""
    url = fake_server("--drip", "0.3")
    started = time.monotonic()
    process = _probe(name, url, tmp_path, "--timeout", "1.5", timeout=90)
    took = time.monotonic() - started
    assert process.returncode == EXIT_FAILED
    assert "no complete answer within 1.5 s (--timeout, a deadline per request)" in _one_clean_line(process)
    requests = {"bench": 3, "conc": 2, "probe_bang": 2}[name]
    assert took < requests * 1.5 + 30  # each request stopped at its deadline (+ start-up on a loaded machine)


def test_a_dripping_model_list(tmp_path: Path, fake_server) -> None:
    process = _probe("bench", fake_server("--drip-models", "0.3"), tmp_path, "--timeout", "1.5", timeout=60)
    assert process.returncode == 1
    assert _one_clean_line(process).endswith("/v1/models: no complete answer within 1.5 s; is the server "
                                             "overloaded (raise --timeout) or a proxy in the way?")
    assert not list(tmp_path.iterdir())


def test_a_server_dripping_its_headers_meets_the_deadline(tmp_path: Path, fake_server) -> None:
    """Issue 39 item 6: a header line a byte at a time defeated --timeout on /v1/models (bench still hung at 60 s)."""
    started = time.monotonic()
    process = _probe("bench", fake_server("--drip-headers", "0.3"), tmp_path, "--timeout", "1.5", timeout=60)
    took = time.monotonic() - started
    assert process.returncode == 1
    assert _one_clean_line(process).endswith("/v1/models: no complete answer within 1.5 s; is the server "
                                             "overloaded (raise --timeout) or a proxy in the way?")
    assert took < 1.5 + 30  # the one call stopped at its deadline (+ start-up on a loaded machine)


# -- issue 28 item 18: a huge answer is cut at the bound, within the deadline; qual's failures exit non-zero -------
@pytest.mark.parametrize("name", ["bench", "conc", "qual", "probe_bang"])
def test_a_huge_answer_is_cut_at_the_bound(tmp_path: Path, fake_server, name: str) -> None:
    """200 MB of valid JSON per answer, as fast as the socket goes: read to 64 MiB at most, and refused."""
    url = fake_server("--huge", "200")
    script, *args = RUNS[name]
    if name == "probe_bang":
        script, args = f"{script} {args[0]}", args[1:]
    started = time.monotonic()
    process, rss = run_script_rss(*script.split(), "--url", url, "--model", "fake", *args, "--timeout", "5",
                                  "--out", str(tmp_path / "r"), timeout=300)
    took = time.monotonic() - started
    assert process.returncode == EXIT_FAILED, process.stderr
    assert "the answer is over the 64 MiB limit of one reply" in _one_clean_line(process)
    # The same run against a server that answers normally is the script's own peak; over it the client held about
    # one bound's worth (64 MiB and a buffer's growth), where reading a whole 200 MB answer holds 200 MiB or more.
    _, base = run_script_rss(*script.split(), "--url", fake_server(), "--model", "fake", *args,
                             "--timeout", "5", "--out", str(tmp_path / "ordinary"), timeout=300)
    assert rss - base < 160 << 20, f"{(rss - base) >> 20} MiB over the ordinary run's {base >> 20} MiB"
    assert took < 90, took


def test_a_huge_model_list_is_cut_at_the_bound(tmp_path: Path, fake_server) -> None:
    args = ("--model", "fake", "--workload", "code", "--timeout", "30")
    process, rss = run_script_rss("bench.py", "--url", fake_server("--huge-models", "200"), *args,
                                  "--out", str(tmp_path / "r"), timeout=120)
    assert process.returncode == 1
    assert _one_clean_line(process).endswith("/v1/models: the answer is over the 64 MiB limit of one reply; point "
                                             "--url at an OpenAI-compatible server")
    # Over the same script's peak against an ordinary server: one bound's worth, not the whole 200 MB list.
    _, base = run_script_rss("bench.py", "--url", fake_server(), *args, "--out", str(tmp_path / "ordinary"),
                             timeout=300)
    assert rss - base < 160 << 20, f"{(rss - base) >> 20} MiB over the ordinary run's {base >> 20} MiB"


def test_qual_exits_non_zero_when_some_items_failed(tmp_path: Path, fake_server) -> None:
    process = _probe("qual", fake_server("--ok", "2"), tmp_path, "--stop-after-failures", "0")
    assert process.returncode == EXIT_FAILED, process.stderr
    assert _one_clean_line(process) == ("error: 2 of the 4 quality items got no answer (arith_3, arith_4) (HTTP 500: "
                                        "engine dead (fake)); a failed request measures nothing (the result files "
                                        "list them)")


# -- item 19: a server that takes the request and says nothing has timed out; it is not down ----------------------
NO_LENGTH = '{"data": [{"id": "fake"}]}'  # no max_model_len: the probes skip /tokenize and go to the first request


@pytest.mark.parametrize("name", ["bench", "conc"])
def test_a_hanging_post_is_a_timeout_not_a_dead_server(tmp_path: Path, fake_server, name: str) -> None:
    # --fixed auto: the first request asks whether the server takes ignore_eos, and hangs
    process = _probe(name, fake_server("--hang", "--models", NO_LENGTH), tmp_path, "--fixed", "auto", "--timeout", "2",
                     timeout=60)
    line = _one_clean_line(process)
    assert process.returncode == 1 and "cannot reach" not in line and "start the server" not in line
    assert line.endswith("took the request but gave no answer: no complete answer within 2 s (--timeout, a deadline "
                         "per request); is it overloaded or stuck? Raise --timeout, or restart it")


def test_a_hanging_tokenize_is_a_timeout(tmp_path: Path, fake_server) -> None:
    process = _probe("bench", fake_server("--hang"), tmp_path, "--timeout", "2", timeout=60)
    assert process.returncode == 1
    assert _one_clean_line(process).endswith("/tokenize: no complete answer within 2 s; is the server overloaded "
                                             "(raise --timeout) or a proxy in the way?")


def test_a_closed_port_is_still_a_dead_server(tmp_path: Path) -> None:
    process = _probe("qual", f"http://127.0.0.1:{free_port()}", tmp_path, timeout=60)
    assert process.returncode == 1
    assert _one_clean_line(process).startswith("error: cannot reach http://127.0.0.1:")


# -- item 20: a workload stops after N failures in a row, and says so -------------------------------------------
def test_bench_stops_a_workload_after_failures_in_a_row(tmp_path: Path, fake_server) -> None:
    """15 planned requests at a hanging server: 3 deadlines, not 15."""
    url = fake_server("--hang", "--models", NO_LENGTH)
    started = time.monotonic()
    process = _probe("bench", url, tmp_path, "--fixed", "none", "--repeats", "3", "--workload", "prose",
                     "--timeout", "2", timeout=120)
    took = time.monotonic() - started
    assert process.returncode == EXIT_FAILED
    result = json.loads((tmp_path / "r.json").read_text())
    rows = {row["workload"]: row for row in result["rows"]}
    planned = rows["code"]["requests"] + rows["code"]["not_sent"]
    assert (rows["code"]["requests"], rows["code"]["failed"], planned) == (3, 3, 9)
    assert rows["prose"]["requests"] == 3 and rows["prose"]["not_sent"] > 0
    assert ("workload code: stopped after 3 failed requests in a row; 6 of its 9 planned requests were not sent "
            "(--stop-after-failures 0 sends them all)") in result["notes"]
    assert took < 2 * 6 + 40, took  # 3 deadlines per workload, plus start-up on a loaded machine


def test_a_flaky_server_gets_every_request(tmp_path: Path, fake_server) -> None:
    """Failures that are not in a row stop nothing: every second request fails, and all six are sent."""
    process = _probe("conc", fake_server("--fail-every", "2"), tmp_path, "--requests", "6", "--stop-after-failures",
                     "2")
    result = json.loads((tmp_path / "r.json").read_text())
    assert process.returncode == 0, process.stderr
    assert [(row["ok"], row["failed"], row["not_sent"]) for row in result["rows"]] == [(3, 3, 0)]
    assert not any("stopped after" in note for note in result["notes"])
