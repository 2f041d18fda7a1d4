"""The one HTTP module: talking to OpenAI-compatible servers (vLLM first), with a clock on every streamed chunk.

Connection failures become one-line UserErrors; an HTTP error on one request of a sweep is a failed Reply (counted
by the caller), because a load test must report failures rather than stop at the first one.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field
from typing import Any

import httpx

from rigstack.errors import UserError

DEFAULT_TIMEOUT_S = 600.0
START_HINT = "start the server with `python scripts/run_prod.py --profile NAME`"


@dataclass(frozen=True)
class Endpoint:
    """Where the server is. The API key never appears in repr() or in any result file."""

    url: str
    model: str
    api_key: str | None = field(default=None, repr=False)

    @property
    def base(self) -> str:
        """The URL without a trailing /v1, so both spellings of --url work."""
        url = self.url.rstrip("/")
        return url[:-3] if url.endswith("/v1") else url

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}


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
    while len(calls) <= index:
        calls.append({"id": None, "type": "function", "function": {"name": "", "arguments": ""}})
    call = calls[index]
    call["id"] = part.get("id") or call["id"]
    function = part.get("function") or {}
    call["function"]["name"] += function.get("name") or ""
    call["function"]["arguments"] += function.get("arguments") or ""


def _absorb_usage(reply: Reply, usage: dict[str, Any] | None) -> None:
    if usage:
        reply.prompt_tokens = usage.get("prompt_tokens")
        reply.completion_tokens = usage.get("completion_tokens")


def _error_text(response: httpx.Response, body: bytes) -> str:
    try:
        message = json.loads(body).get("error", {})
        message = message.get("message") if isinstance(message, dict) else message
    except (ValueError, AttributeError):
        message = None
    return f"HTTP {response.status_code}: {message or body[:200].decode(errors='replace')}"


class Server:
    """An OpenAI-compatible server. Async for the request paths (one loop drives many streams), sync helpers for
    the few metadata calls."""

    def __init__(self, endpoint: Endpoint, timeout_s: float = DEFAULT_TIMEOUT_S) -> None:
        self.endpoint = endpoint
        self.timeout = httpx.Timeout(timeout_s, connect=10.0)

    # -- metadata (sync) -------------------------------------------------------------------------------------
    def _get(self, path: str) -> httpx.Response:
        url = self.endpoint.base + path
        try:
            return httpx.get(url, headers=self.endpoint.headers, timeout=self.timeout)
        except httpx.TransportError as error:
            raise _unreachable(self.endpoint.base, error) from None

    def _answers(self, *paths: str, timeout_s: float = 5.0) -> bool:
        """Every path answers 200; False (never an error) while the server is still booting."""
        try:
            return all(httpx.get(self.endpoint.base + path, headers=self.endpoint.headers, timeout=timeout_s)
                       .status_code == 200 for path in paths)
        except httpx.TransportError:
            return False

    def health(self, timeout_s: float = 5.0) -> bool:
        return self._answers("/health", timeout_s=timeout_s)

    def ready(self) -> bool:
        """Health answers and the model list is served."""
        return self._answers("/health", "/v1/models")

    def models(self) -> list[dict[str, Any]]:
        response = self._get("/v1/models")
        if response.status_code in (401, 403):
            raise UserError(f"{self.endpoint.base} refused the API key (HTTP {response.status_code}); "
                            "check the variable named by --api-key-env")
        if response.status_code != 200:
            raise UserError(f"{self.endpoint.base}/v1/models answered HTTP {response.status_code}; "
                            f"is this an OpenAI-compatible server? {START_HINT}")
        return list(response.json().get("data") or [])

    def check_model(self) -> dict[str, Any]:
        """The served model's card; fails early (before any timing) when the name is wrong."""
        cards = self.models()
        for card in cards:
            if card.get("id") == self.endpoint.model:
                return card
        names = ", ".join(card.get("id", "?") for card in cards) or "none"
        raise UserError(f"model {self.endpoint.model!r} is not served at {self.endpoint.base} (served: {names}); "
                        f"pass --model with one of those")

    def version(self) -> str | None:
        response = self._get("/version")
        return response.json().get("version") if response.status_code == 200 else None

    def metrics(self) -> dict[str, float] | None:
        """Prometheus counters summed over their label sets, or None when the server has no /metrics."""
        response = self._get("/metrics")
        if response.status_code != 200:
            return None
        return parse_prometheus(response.text)

    def tokenize(self, text: str) -> int | None:
        """vLLM's /tokenize: the token count of a text under the served tokenizer, None elsewhere."""
        try:
            response = httpx.post(self.endpoint.base + "/tokenize", headers=self.endpoint.headers,
                                  json={"model": self.endpoint.model, "prompt": text, "add_special_tokens": False},
                                  timeout=self.timeout)
        except httpx.TransportError as error:
            raise _unreachable(self.endpoint.base, error) from None
        return response.json().get("count") if response.status_code == 200 else None

    # -- requests (async) ------------------------------------------------------------------------------------
    def session(self, connections: int = 64) -> httpx.AsyncClient:
        limits = httpx.Limits(max_connections=connections, max_keepalive_connections=connections)
        return httpx.AsyncClient(base_url=self.endpoint.base, headers=self.endpoint.headers, timeout=self.timeout,
                                 limits=limits)

    async def request(self, session: httpx.AsyncClient, path: str, payload: dict[str, Any]) -> Reply:
        """POST one request; streamed when payload["stream"] is true. Never raises for HTTP or transport errors:
        the Reply says what went wrong, so a sweep can count it."""
        payload = {"model": self.endpoint.model, **payload}
        reply = Reply(sent=time.perf_counter())
        try:
            async with session.stream("POST", path, json=payload) as response:
                reply.status = response.status_code
                if response.status_code != 200:
                    reply.error = _error_text(response, await response.aread())
                elif payload.get("stream"):
                    await self._read_stream(response, reply)
                else:
                    body = json.loads(await response.aread())
                    reply.body = body
                    for choice in body.get("choices") or []:
                        _absorb_choice(reply, choice, None)
                    _absorb_usage(reply, body.get("usage"))
                    reply.chunk_times.append(time.perf_counter())
                    reply.ok = True
        except httpx.TransportError as error:
            reply.error = f"{type(error).__name__}: {error}" if str(error) else type(error).__name__
        except json.JSONDecodeError as error:
            reply.ok, reply.error = False, f"malformed JSON from the server ({error.msg})"
        reply.done = time.perf_counter()
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
            chunk = json.loads(data)
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
