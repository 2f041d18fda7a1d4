"""A small OpenAI-shaped HTTP server for the failure paths a real vLLM will not produce on demand.

Run as its own process (the process boundary is what the probes talk across):
    python fake_server.py PORT [--ok N] [--bad-card ID]
--ok N: the first N chat requests stream a proper answer, every later one gets HTTP 500.
--bad-card ID: completions carry token id 0 at position 2 while ID is in CUDA_VISIBLE_DEVICES (a faulty card).
--no-ids: completions spell tokens as text, as servers without vLLM's return_tokens_as_token_ids do.
"""

from __future__ import annotations

import argparse
import json
import os
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

MODEL = "fake"
TOKENS = [11, 12, 13, 14, 15, 16, 17, 18]


class Handler(BaseHTTPRequestHandler):
    ok_left = 0
    bad_card: str | None = None
    no_ids = False
    lock = threading.Lock()

    def log_message(self, *args: object) -> None:  # keep the test output clean
        pass

    def _json(self, status: int, body: object) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        if self.path == "/health":
            self._json(200, {})
        elif self.path == "/v1/models":
            self._json(200, {"data": [{"id": MODEL, "max_model_len": 4096}]})
        else:
            self._json(404, {"error": {"message": "not found"}})

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        if self.path == "/v1/completions":
            self._completion(body)
            return
        with self.lock:
            allowed = Handler.ok_left > 0
            Handler.ok_left -= 1
        if not allowed:
            self._json(500, {"error": {"message": "engine dead (fake)", "code": 500}})
            return
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        for token in range(4):
            chunk = {"choices": [{"index": 0, "delta": {"content": f" t{token}"}, "finish_reason": None}]}
            self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
        usage = {"choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": 4}}
        self.wfile.write(f"data: {json.dumps(usage)}\n\ndata: [DONE]\n\n".encode())

    def _completion(self, body: dict) -> None:
        visible = os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",")
        tokens = list(TOKENS[: body.get("max_tokens", 8)])
        if Handler.bad_card is not None and Handler.bad_card in visible and len(tokens) > 2:
            tokens[2] = 0
        spelled = [f"t{t}" if Handler.no_ids else f"token_id:{t}" for t in tokens]
        logprobs = {"tokens": spelled, "token_logprobs": [-0.5] * len(tokens)}
        self._json(200, {"choices": [{"index": 0, "text": "x" * len(tokens), "logprobs": logprobs,
                                      "finish_reason": "length"}],
                         "usage": {"prompt_tokens": 3, "completion_tokens": len(tokens)}})


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("port", type=int)
    parser.add_argument("--ok", type=int, default=1 << 30)
    parser.add_argument("--bad-card")
    parser.add_argument("--no-ids", action="store_true")
    args = parser.parse_args()
    Handler.ok_left, Handler.bad_card, Handler.no_ids = args.ok, args.bad_card, args.no_ids
    server = ThreadingHTTPServer(("127.0.0.1", args.port), Handler)
    print("ready", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
