"""Where a server is and the credentials it takes: kept out of every URL that is printed or recorded, and blanked
in whatever the server sends back."""

from __future__ import annotations

import base64
import os
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import SplitResult, unquote, urlsplit, urlunsplit

from rigstack.errors import UserError

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
        parts = _checked_url(self.url)
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


def _checked_url(url: str) -> SplitResult:
    """An http(s) URL with a host, or one line saying what is wrong with it (the credentials never shown)."""
    shown = repr(url if "@" not in url else url.rpartition("@")[2])
    if any(ord(char) < 32 or ord(char) == 127 or char.isspace() for char in url):
        raise UserError(f"--url {shown} holds a space or a control character; give the server's URL alone, like "
                        "http://127.0.0.1:8000/v1")
    try:
        parts = urlsplit(url)
        host, _ = parts.hostname, parts.port  # both parse the address: a bad IPv6 bracket or port raises here
    except ValueError as error:
        raise UserError(f"--url {shown} is not a URL ({error}); give one like http://127.0.0.1:8000/v1") from None
    if parts.scheme not in ("http", "https") or not host:
        raise UserError(f"--url {shown}: give an http:// or https:// URL with a host, like http://127.0.0.1:8000/v1")
    return parts


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
