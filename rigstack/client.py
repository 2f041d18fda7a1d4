"""The one HTTP module: talking to OpenAI-compatible servers (vLLM first), with a clock on every streamed chunk.

Connection failures become one-line UserErrors; an HTTP error on one request of a sweep is a failed Reply (counted
by the caller), because a load test must report failures rather than stop at the first one. Every request has an
overall deadline (httpx's timeouts are per read, so a server that drips a byte at a time would never time out), and
whatever the server sends back is scrubbed of the credentials before anything keeps it.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import time
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import unquote, urlsplit, urlunsplit

import httpx

from rigstack.errors import UserError

DEFAULT_TIMEOUT_S = 600.0
START_HINT = "start the server with `python scripts/run_prod.py --profile NAME`"
REDACTED = "***"
# A bare password shorter than this is not blanked on its own (it would blank ordinary words in answers); its
# user:password and base64 forms, which are what an echoing server sends back, always are.
MIN_BARE_SECRET = 4


@dataclass(frozen=True)
class Endpoint:
    """Where the server is. `url` never holds credentials: a user:password@ part moves to `auth` (sent as HTTP
    basic auth), so every printed or recorded URL is clean. Neither the key nor auth appears in repr()."""

    url: str
    model: str
    api_key: str | None = field(default=None, repr=False)
    auth: tuple[str, str] | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        parts = urlsplit(self.url)
        if "@" in parts.netloc:
            userinfo, _, host = parts.netloc.rpartition("@")
            user, _, password = userinfo.partition(":")
            # frozen dataclass: __post_init__ is the one place that may still set fields
            object.__setattr__(self, "auth", (unquote(user), unquote(password)))
            object.__setattr__(self, "url", urlunsplit(parts._replace(netloc=host)))

    @property
    def base(self) -> str:
        """The URL without a trailing /v1, so both spellings of --url work."""
        url = self.url.rstrip("/")
        return url[:-3] if url.endswith("/v1") else url

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}

    @property
    def secrets(self) -> tuple[str, ...]:
        """Every spelling of the credentials a server could echo back (the header's too), longest first."""
        found = [self.api_key] if self.api_key else []
        if self.auth:
            user, password = self.auth
            pair = f"{user}:{password}"
            found += [pair, base64.b64encode(pair.encode()).decode()]
            if len(password) >= MIN_BARE_SECRET:
                found.append(password)
        return tuple(sorted({secret for secret in found if secret}, key=len, reverse=True))

    def redact(self, value: Any) -> Any:
        """value (text, or lists/dicts of it) with every secret replaced by ***."""
        return redact(value, self.secrets)


def redact(value: Any, secrets: tuple[str, ...]) -> Any:
    if not secrets:
        return value
    if isinstance(value, str):
        for secret in secrets:
            value = value.replace(secret, REDACTED)
        return value
    if isinstance(value, dict):
        return {redact(key, secrets): redact(item, secrets) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(redact(item, secrets) for item in value)
    return value


def api_key_from_env(env_var: str | None) -> str | None:
    """The key is read from an env var (never a command-line value, which would land in shell history and ps)."""
    if not env_var:
        return None
    key = os.environ.get(env_var)
    if not key:
        raise UserError(f"API key variable {env_var} is not set; `export {env_var}=...` or drop --api-key-env")
    return key


def _unreachable(url: str, error: Exception) -> UserError:
    return UserError(f"cannot reach {url}: {type(error).__name__}; {START_HINT}")


class Malformed(Exception):
    """The server answered, but not in the OpenAI shape; the message says what was wrong."""


@dataclass
class Reply:
    """One request as the client saw it. Times are time.perf_counter() seconds."""

    sent: float
    ok: bool = False
    status: int | None = None
    error: str | None = None
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
    the few metadata calls. timeout_s is a deadline per request, not per read."""

    def __init__(self, endpoint: Endpoint, timeout_s: float = DEFAULT_TIMEOUT_S) -> None:
        self.endpoint = endpoint
        self.timeout_s = timeout_s
        self.timeout = httpx.Timeout(timeout_s, connect=min(10.0, timeout_s))

    def _late(self) -> str:
        return f"no complete answer within {self.timeout_s:g} s (--timeout, a deadline per request)"

    # -- metadata (sync) -------------------------------------------------------------------------------------
    def _fetch(self, method: str, path: str, timeout_s: float | None = None,
               **kwargs: Any) -> tuple[int, bytes]:
        """(status, body) of one call that must finish within timeout_s overall; a transport failure or a late
        answer is a UserError."""
        limit = self.timeout_s if timeout_s is None else timeout_s
        deadline = time.monotonic() + limit
        url = self.endpoint.base + path
        try:
            with httpx.stream(method, url, headers=self.endpoint.headers, auth=self.endpoint.auth,
                              timeout=httpx.Timeout(limit, connect=min(10.0, limit)), **kwargs) as response:
                body = bytearray()
                for part in response.iter_bytes():
                    body += part
                    if time.monotonic() > deadline:
                        raise UserError(f"{url}: no complete answer within {limit:g} s; is the server overloaded "
                                        "(raise --timeout) or a proxy in the way?")
                return response.status_code, bytes(body)
        except httpx.TransportError as error:
            raise _unreachable(self.endpoint.base, error) from None

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
        version = (self._optional_json("GET", "/version") or {}).get("version")
        return self.endpoint.redact(version) if isinstance(version, str) else None

    def metrics(self) -> dict[str, float] | None:
        """Prometheus counters summed over their label sets, or None when the server has no /metrics."""
        status, body = self._fetch("GET", "/metrics")
        return parse_prometheus(body.decode(errors="replace")) if status == 200 else None

    def tokenize(self, text: str, special: bool = False) -> int | None:
        """vLLM's /tokenize: the token count of a text under the served tokenizer (with the special tokens a
        completion adds when `special`), None elsewhere."""
        return self._count({"prompt": text, "add_special_tokens": special})

    def chat_tokens(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None) -> int | None:
        """vLLM's /tokenize for a chat: the prompt tokens the template makes of these messages (and tools), None
        elsewhere."""
        return self._count({"messages": messages, "add_generation_prompt": True, **({"tools": tools} if tools else {})})

    def _count(self, body: dict[str, Any]) -> int | None:
        count = (self._optional_json("POST", "/tokenize", json={"model": self.endpoint.model, **body}) or {}
                 ).get("count")
        return count if isinstance(count, int) else None

    # -- requests (async) ------------------------------------------------------------------------------------
    def session(self, connections: int = 64) -> httpx.AsyncClient:
        limits = httpx.Limits(max_connections=connections, max_keepalive_connections=connections)
        return httpx.AsyncClient(base_url=self.endpoint.base, headers=self.endpoint.headers, auth=self.endpoint.auth,
                                 timeout=self.timeout, limits=limits)

    async def scrape(self, session: httpx.AsyncClient) -> dict[str, float] | None:
        """The server's counters now, or None when it has no /metrics (or it failed: counters are optional)."""
        try:
            async with asyncio.timeout(self.timeout_s):
                response = await session.get("/metrics")
        except (httpx.TransportError, TimeoutError):
            return None
        return parse_prometheus(response.text) if response.status_code == 200 else None

    async def request(self, session: httpx.AsyncClient, path: str, payload: dict[str, Any]) -> Reply:
        """POST one request; streamed when payload["stream"] is true. Never raises for HTTP, transport, shape or
        deadline errors: the Reply says what went wrong, so a sweep can count it."""
        payload = {"model": self.endpoint.model, **payload}
        reply = Reply(sent=time.perf_counter())
        try:
            async with asyncio.timeout(self.timeout_s), session.stream("POST", path, json=payload) as response:
                reply.status = response.status_code
                if response.status_code != 200:
                    reply.error = _error_text(response.status_code, await response.aread())
                elif payload.get("stream"):
                    await self._read_stream(response, reply)
                else:
                    body = _json_object(await response.aread(), "the reply")
                    reply.body = body
                    for choice in body.get("choices") or []:
                        _absorb_choice(reply, choice, None)
                    _absorb_usage(reply, body.get("usage"))
                    reply.chunk_times.append(time.perf_counter())
                    reply.ok = True
        except httpx.TransportError as error:
            reply.error = f"{type(error).__name__}: {error}" if str(error) else type(error).__name__
        except TimeoutError:
            reply.ok, reply.error = False, self._late()
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
        async for line in response.aiter_lines():
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
