"""The one HTTP module: talking to OpenAI-compatible servers (vLLM first), with a clock on every streamed chunk.

Connection failures become one-line UserErrors; an HTTP error on one request of a sweep is a failed Reply (counted
by the caller), because a load test must report failures rather than stop at the first one. Every request has an
overall deadline (httpx's timeouts are per read, so a server that drips a byte at a time would never time out) and
every answer a size bound (a server that sends hundreds of MB would otherwise take the memory and, once parsed, the
deadline with it); a server that accepts the connection and then says nothing has timed out, it is not down. Whatever
the server sends back is scrubbed of the credentials before anything keeps it.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import httpx

from rigstack.endpoint import Endpoint
from rigstack.errors import UserError
from rigstack.invocation import command

DEFAULT_TIMEOUT_S = 600.0
MAX_TIMEOUT_S = 7 * 24 * 3600.0  # a week; asyncio's and httpx's clocks overflow on the huge ones
START_HINT = f"start the server with `{command('serve --profile NAME')}`"
# The most one answer (a whole body, or a whole stream) may hold: far above any reply of these probes (a 128k-token
# stream is about 30 MiB), far below what would take a host's memory.
MAX_BODY_BYTES = 64 << 20
TOO_LARGE = f"the answer is over the {MAX_BODY_BYTES >> 20} MiB limit of one reply"
# What httpx raises when nothing answered at the address: the server is down (or the URL is wrong).
_NOT_REACHED = (httpx.ConnectError, httpx.ConnectTimeout, httpx.UnsupportedProtocol)


def _unreachable(url: str, error: Exception, gateway: str | None = None) -> UserError:
    """Nothing answered at `url`: the server, or (with `gateway`) one of the fleet's engines behind that gateway,
    which may well be up: the error names the one that is down."""
    if gateway:
        return UserError(f"cannot reach {url}, an engine behind the gateway {gateway} (--fleet): "
                         f"{type(error).__name__}; that engine is down: restart the fleet with "
                         f"`{command('serve --fleet NAME')}` (after `{command('stop --fleet NAME')}`)")
    return UserError(f"cannot reach {url}: {type(error).__name__}; {START_HINT}")


def _named(error: Exception) -> str:
    return f"{type(error).__name__}: {error}" if str(error) else type(error).__name__


def _too_large(response: httpx.Response) -> bool:
    """Whether the answer says up front that it is over the bound (a length header is a claim; reading checks)."""
    length = response.headers.get("content-length", "")
    return length.isdigit() and int(length) > MAX_BODY_BYTES


async def _read_body(response: httpx.Response) -> bytes:
    if _too_large(response):
        raise Malformed(TOO_LARGE)
    body = bytearray()
    async for part in response.aiter_bytes():
        body += part
        if len(body) > MAX_BODY_BYTES:
            raise Malformed(TOO_LARGE)
    return bytes(body)


async def _read_lines(response: httpx.Response) -> AsyncIterator[str]:
    """The stream's lines, the whole stream bounded (httpx's own line reader holds an endless line in memory)."""
    pending, total = bytearray(), 0
    async for part in response.aiter_bytes():
        total += len(part)
        if total > MAX_BODY_BYTES:
            raise Malformed(TOO_LARGE)
        start = 0
        while (end := part.find(b"\n", start)) >= 0:
            pending += part[start:end]
            yield pending.decode(errors="replace").rstrip("\r")
            pending, start = bytearray(), end + 1
        pending += part[start:]
    if pending:
        yield pending.decode(errors="replace").rstrip("\r")


class Malformed(Exception):
    """The server answered, but not in the OpenAI shape; the message says what was wrong."""


@dataclass
class Reply:
    """One request as the client saw it. Times are time.perf_counter() seconds."""

    sent: float
    ok: bool = False
    status: int | None = None
    error: str | None = None
    unreachable: bool = False  # nothing answered at the address (down), as against a server that went silent
    # Arrival time of each chunk that carried output, and how many tokens it carried when the server says so.
    chunk_times: list[float] = field(default_factory=list)
    chunk_tokens: list[int | None] = field(default_factory=list)
    done: float | None = None
    text: str = ""
    reasoning: str = ""
    tool_calls: list[dict[str, Any]] = field(default_factory=list)
    finish_reason: str | None = None
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    body: dict[str, Any] | None = None

    @property
    def ttft(self) -> float | None:
        return self.chunk_times[0] - self.sent if self.chunk_times else None

    @property
    def e2e(self) -> float | None:
        return self.done - self.sent if self.done is not None else None

    @property
    def tokens(self) -> int:
        """Output tokens: the server's usage count when it sent one, else the chunks we saw."""
        if self.completion_tokens is not None:
            return self.completion_tokens
        return len(self.token_ids) or len(self.chunk_times)


def _token_id(token: str) -> int | None:
    # With return_tokens_as_token_ids, vLLM spells each token "token_id:123".
    if token.startswith("token_id:"):
        try:
            return int(token.split(":", 1)[1])
        except ValueError:
            return None
    return None


def _absorb_logprobs(reply: Reply, logprobs: dict[str, Any] | None) -> int:
    """Token ids and logprobs from either API's logprobs block; returns how many tokens it held."""
    if not logprobs:
        return 0
    if "content" in logprobs:  # chat: [{"token", "logprob", ...}]
        entries = logprobs.get("content") or []
        for entry in entries:
            reply.logprobs.append(float(entry["logprob"]))
            tid = _token_id(entry.get("token", ""))
            if tid is not None:
                reply.token_ids.append(tid)
        return len(entries)
    tokens = logprobs.get("tokens") or []  # completions: parallel lists
    for token, logprob in zip(tokens, logprobs.get("token_logprobs") or []):
        reply.logprobs.append(float(logprob) if logprob is not None else float("nan"))
        tid = _token_id(token)
        if tid is not None:
            reply.token_ids.append(tid)
    return len(tokens)


def _absorb_choice(reply: Reply, choice: dict[str, Any], now: float | None) -> None:
    """Fold one choice (a streamed delta or a whole message) into the reply."""
    delta = choice.get("delta") or choice.get("message") or {}
    text = choice.get("text") or delta.get("content") or ""
    reasoning = delta.get("reasoning_content") or delta.get("reasoning") or ""
    reply.text += text
    reply.reasoning += reasoning
    for call in delta.get("tool_calls") or []:
        _merge_tool_call(reply.tool_calls, call)
    ids = choice.get("token_ids")
    explicit_ids = ids is not None
    if ids:
        reply.token_ids.extend(int(i) for i in ids)
    seen_before = len(reply.token_ids)
    counted = _absorb_logprobs(reply, choice.get("logprobs"))
    if explicit_ids and len(reply.token_ids) > seen_before:
        # token_ids and token_id:N spellings both present: keep the explicit list only.
        del reply.token_ids[seen_before:]
    if choice.get("finish_reason"):
        reply.finish_reason = choice["finish_reason"]
    if now is not None and (text or reasoning or delta.get("tool_calls") or ids or counted):
        reply.chunk_times.append(now)
        reply.chunk_tokens.append(len(ids) if ids else (counted or None))


def _merge_tool_call(calls: list[dict[str, Any]], part: dict[str, Any]) -> None:
    """Streamed tool calls arrive as fragments keyed by index; whole messages carry complete calls."""
    index = part.get("index", len(calls))
    if not isinstance(index, int) or not 0 <= index <= len(calls):  # a new call takes the next index
        raise Malformed(f"tool call index {index!r} after {len(calls)} calls")
    if index == len(calls):
        calls.append({"id": None, "type": "function", "function": {"name": "", "arguments": ""}})
    call = calls[index]
    call["id"] = part.get("id") or call["id"]
    function = part.get("function") or {}
    call["function"]["name"] += function.get("name") or ""
    call["function"]["arguments"] += function.get("arguments") or ""


def _absorb_usage(reply: Reply, usage: dict[str, Any] | None) -> None:
    if not usage:
        return
    for name in ("prompt_tokens", "completion_tokens"):
        count = usage.get(name)
        if count is not None and (not isinstance(count, int) or isinstance(count, bool) or count < 0):
            raise Malformed(f"usage.{name} is {count!r}, not a token count")
        setattr(reply, name, count)


def _error_text(status: int, body: bytes) -> str:
    try:
        message = json.loads(body).get("error", {})
        message = message.get("message") if isinstance(message, dict) else message
    except (ValueError, AttributeError):
        message = None
    return f"HTTP {status}: {message or body[:200].decode(errors='replace')}"


def _json_object(body: bytes | str, what: str) -> dict[str, Any]:
    try:
        value = json.loads(body)
    except ValueError as error:
        raise Malformed(f"{what} is not JSON ({str(error).split(':')[0]}): {_peek(body)}") from None
    if not isinstance(value, dict):
        raise Malformed(f"{what} is JSON {type(value).__name__}, not an object: {_peek(body)}")
    return value


def _peek(body: bytes | str) -> str:
    text = body.decode(errors="replace") if isinstance(body, bytes) else body
    return repr(text[:60])


# What a reply of the wrong shape raises while it is folded into a Reply (a list where an object belongs, a number
# where text belongs): caught in one place and reported as a malformed reply, never a traceback.
SHAPE_ERRORS = (AttributeError, TypeError, KeyError, ValueError)


class Server:
    """An OpenAI-compatible server. Async for the request paths (one loop drives many streams), sync helpers for
    the few metadata calls. timeout_s is a deadline per request, not per read.
    `engines`: behind a gateway (a fleet's, rigstack.gateway), the URLs of the engines that serve endpoint.model:
    requests go to the gateway, the counters (summed over them), /version and /tokenize come from them."""

    def __init__(self, endpoint: Endpoint, timeout_s: float = DEFAULT_TIMEOUT_S, engines: tuple[str, ...] = ()) -> None:
        if not 0 < timeout_s <= MAX_TIMEOUT_S:  # NaN fails this too
            raise UserError(f"--timeout {timeout_s:g}: give the seconds a request may take, above 0 and at most "
                            f"{MAX_TIMEOUT_S:g}")
        self.endpoint = endpoint
        self.timeout_s = timeout_s
        self.timeout = httpx.Timeout(timeout_s, connect=min(10.0, timeout_s))
        self.engines = engines

    @property
    def _engine(self) -> str | None:
        """Where /version and /tokenize are asked: the first engine behind a gateway, else the server itself."""
        return self.engines[0] if self.engines else None

    def _late(self) -> str:
        return f"no complete answer within {self.timeout_s:g} s (--timeout, a deadline per request)"

    # -- metadata (sync) -------------------------------------------------------------------------------------
    def _fetch(self, method: str, path: str, timeout_s: float | None = None, base: str | None = None,
               **kwargs: Any) -> tuple[int, bytes]:
        """(status, body) of one call (to `base`, default the server) that must finish within timeout_s overall,
        headers included (a server dripping its header lines held a per-read timeout forever); a transport failure
        or a late answer is a UserError. Called outside any event loop: the probes' metadata, readiness polls."""
        limit = self.timeout_s if timeout_s is None else timeout_s
        url = (base or self.endpoint.base) + path
        # a call to an engine behind the gateway names that engine, not the gateway, when it fails
        where, gateway = (base, self.endpoint.base) if base and base != self.endpoint.base else \
            (self.endpoint.base, None)

        async def call() -> tuple[int, bytes]:
            async with asyncio.timeout(limit), \
                    httpx.AsyncClient(timeout=httpx.Timeout(limit, connect=min(10.0, limit))) as client, \
                    client.stream(method, url, headers=self.endpoint.headers, auth=self.endpoint.auth,
                                  **kwargs) as response:
                return response.status_code, await _read_body(response)

        try:
            return asyncio.run(call())
        except Malformed:  # the one thing _read_body refuses: the size bound
            raise UserError(f"{url}: {TOO_LARGE}; point --url at an OpenAI-compatible server") from None
        except _NOT_REACHED as error:
            raise _unreachable(where, error, gateway) from None
        except (TimeoutError, httpx.TimeoutException):  # the port answered, then no whole answer within the limit
            raise UserError(f"{url}: no complete answer within {limit:g} s; is the server overloaded (raise "
                            "--timeout) or a proxy in the way?") from None
        except httpx.TransportError as error:
            raise _unreachable(where, error, gateway) from None

    def _answers(self, *paths: str, timeout_s: float = 5.0) -> bool:
        """Every path answers 200; False (never an error) while the server is still booting."""
        try:
            return all(self._fetch("GET", path, timeout_s)[0] == 200 for path in paths)
        except UserError:
            return False

    def health(self, timeout_s: float = 5.0) -> bool:
        return self._answers("/health", timeout_s=timeout_s)

    def ready(self) -> bool:
        """Health answers and the model list is served."""
        return self._answers("/health", "/v1/models")

    def models(self) -> list[dict[str, Any]]:
        status, body = self._fetch("GET", "/v1/models")
        where = f"{self.endpoint.base}/v1/models"
        if status in (401, 403):
            raise UserError(f"{self.endpoint.base} refused the API key (HTTP {status}); "
                            "check the variable named by --api-key-env")
        if status != 200:
            raise UserError(f"{where} answered HTTP {status}; is this an OpenAI-compatible server? {START_HINT}")
        try:
            cards = _json_object(body, "the answer")
        except Malformed as error:
            raise UserError(f"{where}: {self.endpoint.redact(str(error))}, not an OpenAI model list "
                            '{"data": [...]}; point --url at an OpenAI-compatible server') from None
        data = cards.get("data")
        if not isinstance(data, list) or not all(isinstance(card, dict) for card in data):
            raise UserError(f"{where}: \"data\" is not a list of model cards; point --url at an OpenAI-compatible "
                            "server")
        return data

    def check_model(self) -> dict[str, Any]:
        """The served model's card; fails early (before any timing) when the name is wrong."""
        cards = self.models()
        for card in cards:
            if card.get("id") == self.endpoint.model:
                return card
        names = ", ".join(str(card.get("id", "?")) for card in cards) or "none"
        raise UserError(f"model {self.endpoint.model!r} is not served at {self.endpoint.base} (served: "
                        f"{self.endpoint.redact(names)}); pass --model with one of those")

    def _optional_json(self, method: str, path: str, **kwargs: Any) -> dict[str, Any] | None:
        """An optional endpoint's JSON object, None when the server lacks it or answers something else."""
        status, body = self._fetch(method, path, **kwargs)
        try:
            return _json_object(body, path) if status == 200 else None
        except Malformed:
            return None

    def collective_rpc(self, method: str, *args: str, timeout_s: float | None = None) -> list[Any]:
        """Every worker's answer to `method` through vLLM's dev endpoint (served with VLLM_SERVER_DEV_MODE=1)."""
        where = f"{self.endpoint.base}/collective_rpc"
        status, body = self._fetch("POST", "/collective_rpc", timeout_s, json={"method": method, "args": list(args)})
        if status == 404:
            raise UserError(f"{where} is not served; start the server with VLLM_SERVER_DEV_MODE=1")
        if status != 200:
            raise UserError(f"{where}: {method} failed: {self.endpoint.redact(_error_text(status, body))}")
        try:
            results = _json_object(body, "the answer").get("results")
        except Malformed as error:
            raise UserError(f"{where}: {self.endpoint.redact(str(error))}") from None
        if not isinstance(results, list):
            raise UserError(f"{where}: the answer has no \"results\" list")
        return results

    def version(self) -> str | None:
        version = (self._optional_json("GET", "/version", base=self._engine) or {}).get("version")
        return self.endpoint.redact(version) if isinstance(version, str) else None

    def metrics(self) -> dict[str, float] | None:
        """Prometheus counters summed over their label sets (and over the engines behind a gateway), or None when
        the server (or one engine) has no /metrics."""
        found = [self._fetch("GET", "/metrics", base=base) for base in self.engines or (None,)]
        if any(status != 200 for status, _ in found):
            return None
        return _summed([parse_prometheus(body.decode(errors="replace")) for _, body in found])

    def tokenize(self, text: str, special: bool = False) -> int | None:
        """vLLM's /tokenize: the token count of a text under the served tokenizer (with the special tokens a
        completion adds when `special`), None elsewhere."""
        return self._count({"prompt": text, "add_special_tokens": special})

    def chat_tokens(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None) -> int | None:
        """vLLM's /tokenize for a chat: the prompt tokens the template makes of these messages (and tools), None
        elsewhere."""
        return self._count({"messages": messages, "add_generation_prompt": True, **({"tools": tools} if tools else {})})

    def _count(self, body: dict[str, Any]) -> int | None:
        count = (self._optional_json("POST", "/tokenize", base=self._engine,
                                     json={"model": self.endpoint.model, **body}) or {}).get("count")
        return count if isinstance(count, int) else None

    # -- requests (async) ------------------------------------------------------------------------------------
    def session(self, connections: int = 64) -> httpx.AsyncClient:
        limits = httpx.Limits(max_connections=connections, max_keepalive_connections=connections)
        return httpx.AsyncClient(base_url=self.endpoint.base, headers=self.endpoint.headers, auth=self.endpoint.auth,
                                 timeout=self.timeout, limits=limits)

    @staticmethod
    async def _scrape_one(session: httpx.AsyncClient, url: str) -> str | None:
        """One engine's /metrics text, read within the body bound; None when it has none."""
        async with session.stream("GET", url) as response:
            if response.status_code != 200:
                return None
            return (await _read_body(response)).decode(errors="replace")

    async def scrape(self, session: httpx.AsyncClient) -> dict[str, float] | None:
        """The server's counters now, or None when it has no /metrics (or it failed: counters are optional)."""
        try:
            async with asyncio.timeout(self.timeout_s):
                texts = [await self._scrape_one(session, f"{base}/metrics") for base in self.engines or ("",)]
        except (httpx.TransportError, TimeoutError, Malformed):
            return None
        if any(text is None for text in texts):
            return None
        return _summed([parse_prometheus(text) for text in texts])

    async def request(self, session: httpx.AsyncClient, path: str, payload: dict[str, Any]) -> Reply:
        """POST one request; streamed when payload["stream"] is true. Never raises for HTTP, transport, shape or
        deadline errors: the Reply says what went wrong, so a sweep can count it."""
        payload = {"model": self.endpoint.model, **payload}
        reply = Reply(sent=time.perf_counter())
        try:
            async with asyncio.timeout(self.timeout_s), session.stream("POST", path, json=payload) as response:
                reply.status = response.status_code
                if response.status_code != 200:
                    reply.error = _error_text(response.status_code, await _read_body(response))
                elif payload.get("stream"):
                    await self._read_stream(response, reply)
                else:
                    body = _json_object(await _read_body(response), "the reply")
                    reply.body = body
                    for choice in body.get("choices") or []:
                        _absorb_choice(reply, choice, None)
                    _absorb_usage(reply, body.get("usage"))
                    reply.chunk_times.append(time.perf_counter())
                    reply.ok = True
        except _NOT_REACHED as error:
            reply.error, reply.unreachable = _named(error), True
        except (TimeoutError, httpx.TimeoutException):  # the deadline, or httpx's read timeout (the same length)
            reply.ok, reply.error = False, self._late()
        except httpx.TransportError as error:
            reply.error = _named(error)
        except Malformed as error:
            reply.ok, reply.error = False, f"malformed reply from the server: {error}"
        except SHAPE_ERRORS as error:
            reply.ok, reply.error = False, (f"malformed reply from the server: a field of the wrong type "
                                            f"({type(error).__name__}: {error})")
        reply.done = time.perf_counter()
        return self._scrubbed(reply)

    def _scrubbed(self, reply: Reply) -> Reply:
        """The reply without the credentials in anything the server sent (an echoing server would plant them)."""
        if self.endpoint.secrets:
            for name in ("error", "text", "reasoning", "tool_calls", "body"):
                setattr(reply, name, self.endpoint.redact(getattr(reply, name)))
        return reply

    @staticmethod
    async def _read_stream(response: httpx.Response, reply: Reply) -> None:
        async for line in _read_lines(response):
            if not line.startswith("data:"):
                continue
            data = line[5:].strip()
            if data == "[DONE]":
                reply.ok = reply.error is None
                return
            now = time.perf_counter()
            chunk = _json_object(data, "a stream chunk")
            if "error" in chunk:  # vLLM reports a failure inside a stream as an error object
                error = chunk["error"]
                reply.error = str(error.get("message") if isinstance(error, dict) else error)
                continue
            for choice in chunk.get("choices") or []:
                _absorb_choice(reply, choice, now)
            _absorb_usage(reply, chunk.get("usage"))
        reply.error = reply.error or "stream ended without [DONE]"


def _summed(counters: list[dict[str, float]]) -> dict[str, float]:
    """Several engines' counters as one server's (histogram sums and counts add up the same way)."""
    total: dict[str, float] = {}
    for found in counters:
        for name, value in found.items():
            total[name] = total.get(name, 0.0) + value
    return total


def parse_prometheus(text: str) -> dict[str, float]:
    """name -> value, summed over label sets (a server may label per engine or per model)."""
    values: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        name_part, _, value = line.rpartition(" ")
        name = name_part.split("{", 1)[0].strip()
        try:
            values[name] = values.get(name, 0.0) + float(value)
        except ValueError:
            continue
    return values
