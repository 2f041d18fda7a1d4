"""Completions as a client sees them, for the e2e tests that count what was lost (issue 37 item 2): a 200 whose body
is an error, or that holds no text or no tokens, is not an answer, and status codes alone cannot tell."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import httpx


@dataclass(frozen=True)
class Answer:
    status: int  # the HTTP status; 0 when no response came
    text: str | None  # choices[0].text
    tokens: int  # usage.completion_tokens
    expected: int | None = None  # the completion tokens a whole answer has (ignore_eos: exactly max_tokens)

    @property
    def whole(self) -> bool:
        if self.status != 200 or not self.text or self.tokens <= 0:
            return False
        return self.expected is None or self.tokens == self.expected

    def __str__(self) -> str:
        return "whole" if self.whole else f"HTTP {self.status}, {self.tokens} tokens, text {self.text!r:.40}"


def complete(url: str, model: str, prompt: str | list[int], max_tokens: int, *, ignore_eos: bool = False,
             timeout: float = 120) -> Answer:
    """One greedy /v1/completions request. With ignore_eos every answer runs max_tokens, which it then must have."""
    payload: dict[str, Any] = {"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0}
    if ignore_eos:
        payload["ignore_eos"] = True
    expected = max_tokens if ignore_eos else None
    try:
        reply = httpx.post(url + "/v1/completions", json=payload, timeout=timeout)
    except httpx.HTTPError:
        return Answer(0, None, 0, expected)
    try:
        body = reply.json()
        return Answer(reply.status_code, body["choices"][0]["text"], int(body["usage"]["completion_tokens"]),
                      expected)
    except (ValueError, KeyError, IndexError, TypeError):
        return Answer(reply.status_code, None, 0, expected)
