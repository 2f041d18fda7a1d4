"""A small OpenAI-shaped HTTP server for the failure paths a real vLLM will not produce on demand.

Run as its own process (the process boundary is what the probes talk across):
    python fake_server.py PORT [options]
--ok N: the first N chat or completion requests answer, every later one gets HTTP 500.
--fail-every K: every K-th chat or completion request gets HTTP 500 (a flaky server: never two in a row for K > 1).
--bad-card ID: completions carry token id 0 at position 2 while ID is in CUDA_VISIBLE_DEVICES (a faulty card).
--no-ids: completions spell tokens as text, as servers without vLLM's return_tokens_as_token_ids do.
--tokens N / --step-ms S: chat answers stream N tokens, one every S ms of "engine" time (default 4, at once).
--burst: hold a chat answer's chunks and flush them together at the end (what the tiny CPU vLLM server does).
--metrics: serve /metrics with vLLM's counter and timing histograms, kept on the engine's true clock.
--echo-auth: every answer and error message repeats the Authorization header it got (a careless proxy).
--max-model-len N: the context length /v1/models reports (default 4096); longer requests get vLLM's HTTP 400.
--models BODY / --chunk TEXT / --reply BODY: send BODY as the /v1/models answer, TEXT as the first `data:` line of
    every chat stream, or BODY as every answer that is not streamed (garbage, a JSON list, ...).
--drip S: POST answers send one byte every S seconds and never finish; --drip-models S does so for /v1/models.
--huge MB: chat and completion answers are one valid JSON body (or one stream chunk) of MB megabytes, without a
    length header; --huge-models MB does so for /v1/models.
--hang: every POST is read and then never answered (the port stays open: a stuck server, not a down one).
--drip-headers S: every request is answered with a status line, then a header byte every S seconds, never ending
    (each read gets a byte in time, so only a deadline over the whole request ends it).
--counts: POST /collective_rpc answers patch 0014's expert count table (two layers of 8 experts), its model
    fingerprint repeating the Authorization header under --echo-auth; --table JSON answers JSON as the table.
"""

from __future__ import annotations

import argparse
import json
import os
import threading
import time
from collections import defaultdict
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

MODEL = "fake"
TOKENS = [11, 12, 13, 14, 15, 16, 17, 18]
PROMPT_TOKENS = 5  # what every prompt counts as here
ARGS = argparse.Namespace()
LOCK = threading.Lock()
COUNTERS: defaultdict[str, float] = defaultdict(float)
STATE = {"ok_left": 0, "seen": 0}


def _observe(tokens: int, ttft: float, decode: float, gaps: list[float]) -> None:
    """What vLLM's metrics logger records for one finished request."""
    with LOCK:
        COUNTERS["vllm:generation_tokens_total"] += tokens
        COUNTERS["vllm:inter_token_latency_seconds_sum"] += sum(gaps)
        COUNTERS["vllm:inter_token_latency_seconds_count"] += len(gaps)
        COUNTERS["vllm:request_decode_time_seconds_sum"] += decode
        COUNTERS["vllm:request_decode_time_seconds_count"] += 1
        COUNTERS["vllm:request_time_per_output_token_seconds_sum"] += decode / (tokens - 1) if tokens > 1 else 0.0
        COUNTERS["vllm:request_time_per_output_token_seconds_count"] += 1
        COUNTERS["vllm:time_to_first_token_seconds_sum"] += ttft
        COUNTERS["vllm:time_to_first_token_seconds_count"] += 1


class Handler(BaseHTTPRequestHandler):
    def log_message(self, *args: object) -> None:  # keep the test output clean
        pass

    def _echo(self) -> str:
        return f" (you sent {self.headers.get('Authorization')})" if ARGS.echo_auth else ""

    def _raw(self, status: int, data: bytes, kind: str = "application/json") -> None:
        self.send_response(status)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _json(self, status: int, body: object) -> None:
        self._raw(status, json.dumps(body).encode())

    def _drip(self, seconds: float) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", "100000")
        self.end_headers()
        while True:
            self.wfile.write(b" ")
            self.wfile.flush()
            time.sleep(seconds)

    def _drip_headers(self, seconds: float) -> None:
        self.wfile.write(b"HTTP/1.1 200 OK\r\nX-Slow: ")
        while True:
            self.wfile.write(b"a")
            self.wfile.flush()
            time.sleep(seconds)

    def _huge(self, megabytes: float, stream: bool) -> None:
        """A valid answer of `megabytes`, close-delimited (HTTP/1.0: no Content-Length), sent as fast as it goes."""
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream" if stream else "application/json")
        self.end_headers()
        if stream:
            head, tail = b'data: {"choices": [{"index": 0, "delta": {"content": "', b'"}}]}\n\ndata: [DONE]\n\n'
        elif self.command == "GET":
            head, tail = b'{"data": [{"id": "fake", "x": "', b'"}]}'
        else:
            head, tail = b'{"choices": [{"index": 0, "text": "', b'"}]}'
        block = b"x" * (1 << 20)
        try:
            self.wfile.write(head)
            for _ in range(int(megabytes)):
                self.wfile.write(block)
            self.wfile.write(tail)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the client stopped reading at its bound: what the tests want

    def do_GET(self) -> None:
        if ARGS.drip_headers:
            self._drip_headers(ARGS.drip_headers)
        elif self.path == "/health":
            self._json(200, {})
        elif self.path == "/v1/models":
            if ARGS.drip_models:
                self._drip(ARGS.drip_models)
            elif ARGS.huge_models:
                self._huge(ARGS.huge_models, stream=False)
            elif ARGS.models is not None:
                self._raw(200, ARGS.models.encode())
            else:
                self._json(200, {"data": [{"id": MODEL, "max_model_len": ARGS.max_model_len}]})
        elif self.path == "/metrics" and ARGS.metrics:
            with LOCK:
                text = "".join(f'{name}{{engine="0",model_name="{MODEL}"}} {value}\n'
                               for name, value in COUNTERS.items())
            self._raw(200, text.encode(), "text/plain")
        else:
            self._json(404, {"error": {"message": "not found"}})

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        if ARGS.hang:
            time.sleep(3600)
            return
        if ARGS.drip_headers:
            self._drip_headers(ARGS.drip_headers)
            return
        if ARGS.counts and self.path == "/collective_rpc":
            table = {"format": "rigstack-hot-experts/1", "expert_bytes": 1 << 20,
                     "model": {"architecture": f"FakeMoe{self._echo()}", "experts": 8},
                     "counts": {"layers.0": [40, 30, 10, 5, 5, 4, 3, 3], "layers.1": [3, 3, 4, 5, 5, 10, 30, 40]}}
            self._json(200, {"results": [json.loads(ARGS.table) if ARGS.table else table]})
            return
        if self.path not in ("/v1/completions", "/v1/chat/completions"):
            self._json(404, {"error": {"message": "not found"}})
            return
        if ARGS.drip:
            self._drip(ARGS.drip)
            return
        if ARGS.huge:
            self._huge(ARGS.huge, stream=bool(body.get("stream")))
            return
        if body.get("max_tokens", 0) + PROMPT_TOKENS > ARGS.max_model_len:  # as vLLM refuses it
            self._json(400, {"error": {"message": f"This model's maximum context length is {ARGS.max_model_len} "
                                                  f"tokens. However, you requested {body['max_tokens']} output "
                                                  f"tokens and your prompt contains {PROMPT_TOKENS} tokens",
                                       "code": 400}})
            return
        with LOCK:
            STATE["seen"] += 1
            allowed = STATE["ok_left"] > 0 and not (ARGS.fail_every and STATE["seen"] % ARGS.fail_every == 0)
            STATE["ok_left"] -= 1
        if not allowed:
            self._json(500, {"error": {"message": f"engine dead (fake){self._echo()}", "code": 500}})
        elif ARGS.reply is not None and not body.get("stream"):
            self._raw(200, ARGS.reply.encode())
        elif self.path == "/v1/completions":
            self._completion(body)
        elif not body.get("stream"):
            self._json(200, {"choices": [{"index": 0, "message": {"role": "assistant", "content": f"t0{self._echo()}"},
                                          "finish_reason": "stop"}],
                             "usage": {"prompt_tokens": PROMPT_TOKENS, "completion_tokens": 1}})
        else:
            self._chat()

    def _chat(self) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        held: list[bytes] = []
        if ARGS.chunk is not None:
            held.append(f"data: {ARGS.chunk}\n\n".encode())
        start, stamps = time.perf_counter(), []
        for token in range(ARGS.tokens):
            time.sleep(ARGS.step_ms / 1000)
            stamps.append(time.perf_counter())
            text = f" t{token}{self._echo() if token == 0 else ''}"
            chunk = {"choices": [{"index": 0, "delta": {"content": text}, "finish_reason": None}]}
            held.append(f"data: {json.dumps(chunk)}\n\n".encode())
            if not ARGS.burst:
                self.wfile.write(b"".join(held))
                self.wfile.flush()
                held.clear()
        usage = {"choices": [], "usage": {"prompt_tokens": PROMPT_TOKENS, "completion_tokens": ARGS.tokens}}
        held.append(f"data: {json.dumps(usage)}\n\ndata: [DONE]\n\n".encode())
        _observe(ARGS.tokens, stamps[0] - start, stamps[-1] - stamps[0], [b - a for a, b in zip(stamps, stamps[1:])])
        self.wfile.write(b"".join(held))

    def _completion(self, body: dict) -> None:
        visible = os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",")
        tokens = list(TOKENS[: body.get("max_tokens", 8)])
        if ARGS.bad_card is not None and ARGS.bad_card in visible and len(tokens) > 2:
            tokens[2] = 0
        spelled = [f"t{t}" if ARGS.no_ids else f"token_id:{t}" for t in tokens]
        logprobs = {"tokens": spelled, "token_logprobs": [-0.5] * len(tokens)}
        self._json(200, {"choices": [{"index": 0, "text": "x" * len(tokens) + self._echo(), "logprobs": logprobs,
                                      "finish_reason": "length"}],
                         "usage": {"prompt_tokens": PROMPT_TOKENS, "completion_tokens": len(tokens)}})


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("port", type=int)
    parser.add_argument("--ok", type=int, default=1 << 30)
    parser.add_argument("--bad-card")
    parser.add_argument("--no-ids", action="store_true")
    parser.add_argument("--tokens", type=int, default=4)
    parser.add_argument("--step-ms", type=float, default=0.0)
    parser.add_argument("--burst", action="store_true")
    parser.add_argument("--metrics", action="store_true")
    parser.add_argument("--echo-auth", action="store_true")
    parser.add_argument("--max-model-len", type=int, default=4096)
    parser.add_argument("--models")
    parser.add_argument("--chunk")
    parser.add_argument("--reply")
    parser.add_argument("--drip", type=float, default=0.0)
    parser.add_argument("--drip-models", type=float, default=0.0)
    parser.add_argument("--huge", type=float, default=0.0)
    parser.add_argument("--huge-models", type=float, default=0.0)
    parser.add_argument("--hang", action="store_true")
    parser.add_argument("--fail-every", type=int, default=0)
    parser.add_argument("--counts", action="store_true")
    parser.add_argument("--table")
    parser.add_argument("--drip-headers", type=float, default=0.0)
    parser.parse_args(namespace=ARGS)
    STATE["ok_left"] = ARGS.ok
    server = ThreadingHTTPServer(("127.0.0.1", ARGS.port), Handler)
    server.daemon_threads = True  # a dripping answer never ends: do not wait for it on shutdown
    print("ready", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
