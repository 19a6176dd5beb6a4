"""One webhook POST and what its outcome means: the config, the request's headers and
signature, and the classification of the answer (sent, retry, or give up).

Semantics, as GitHub's and Stripe's webhooks have them: the body is signed with
HMAC-SHA256 (`X-Appliance-Signature: sha256=<hex>`), every attempt of one delivery
carries the same `X-Appliance-Delivery` id so a receiver can drop duplicates, 2xx is
success, 429 and 5xx and network failures are retried, any other answer is final.
"""

from __future__ import annotations

import hashlib
import hmac
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, version
from typing import Annotated, Literal
from urllib.parse import urlsplit

import aiohttp
from pydantic import BaseModel, ConfigDict, Field, field_validator

from sinks.deadletter import DeadLetterConfig, MiB
from sinks.retry import BackoffConfig, retry_after_s

ANSWER_BYTES = 1024  # of a refused answer kept for the dead letter: enough for an error
RESERVED_HEADERS = frozenset(
    {"content-type", "x-appliance-event", "x-appliance-delivery", "x-appliance-signature"}
)
try:
    USER_AGENT = f"appliance/{version('appliance')}"
except PackageNotFoundError:  # run from a source tree that was never installed
    USER_AGENT = "appliance"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class QueueConfig(_Strict):
    max_messages: Annotated[int, Field(ge=1)] = 1000
    max_bytes: Annotated[int, Field(ge=1024)] = 8 * MiB  # encoded bodies waiting


class WebhookConfig(_Strict):
    """One webhook destination (`sinks.<name>` in the config, `type: webhook`)."""

    type: Literal["webhook"]
    url: str  # http or https; userinfo and query are never logged
    secret: Annotated[str | None, Field(min_length=1, repr=False)] = None  # HMAC key
    # Extra headers (an API key, say): values are secrets, never logged or shown.
    headers: dict[str, str] = Field(default_factory=dict, repr=False)
    timeout_s: Annotated[float, Field(gt=0, le=300)] = 5.0  # one attempt, connect to answer
    retries: Annotated[int, Field(ge=0, le=100)] = 5  # attempts after the first
    backoff: BackoffConfig = BackoffConfig()
    max_retry_after_s: Annotated[float, Field(ge=0)] = 300.0  # cap on a server's Retry-After
    concurrency: Annotated[int, Field(ge=1, le=64)] = 4  # deliveries in flight at once
    queue: QueueConfig = QueueConfig()
    dead_letter: DeadLetterConfig = DeadLetterConfig()

    @field_validator("url")
    @classmethod
    def _http_url(cls, v: str) -> str:
        parts = urlsplit(v)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError("expected an http:// or https:// URL with a host")
        if any(c.isspace() for c in v):
            raise ValueError("must not contain whitespace")
        parts.port  # noqa: B018  raises ValueError for a port out of range
        return v

    @field_validator("headers")
    @classmethod
    def _not_reserved(cls, v: dict[str, str]) -> dict[str, str]:
        reserved = sorted(k for k in v if k.lower() in RESERVED_HEADERS)
        if reserved:
            raise ValueError(f"set by the sink, cannot be overridden: {', '.join(reserved)}")
        bad = sorted(k for k, val in v.items() if any(c in k + val for c in "\r\n\0"))
        if bad:
            raise ValueError(f"line breaks or NUL in header {', '.join(bad)}")
        return v


def safe_url(url: str) -> str:
    """`scheme://host:port/path` only: userinfo and query may hold credentials, and
    sinks/ cannot use appliance.masking (imports run one way)."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    host = f"[{host}]" if ":" in host else host
    port = f":{parts.port}" if parts.port else ""
    return f"{parts.scheme}://{host}{port}{parts.path}"


@dataclass(frozen=True, slots=True)
class Attempt:
    """The outcome of one POST."""

    ok: bool
    retry: bool = False  # worth another attempt
    error: str | None = None  # masked: no URL query, secret or header value
    status: int | None = None  # HTTP status; None when no answer came
    answer: str | None = None  # the first ANSWER_BYTES of a refused answer
    retry_after_s: float | None = None  # the server's Retry-After, capped


def headers_for(config: WebhookConfig, event: str, delivery_id: str, body: bytes) -> dict[str, str]:
    """The request's headers; the signature covers exactly `body`, the bytes sent."""
    headers = {
        **config.headers,
        "Content-Type": "application/json",
        "User-Agent": USER_AGENT,
        "X-Appliance-Event": event,
        "X-Appliance-Delivery": delivery_id,
    }
    if config.secret is not None:
        digest = hmac.new(config.secret.encode("utf-8"), body, hashlib.sha256).hexdigest()
        headers["X-Appliance-Signature"] = f"sha256={digest}"
    return headers


async def post(
    session: aiohttp.ClientSession, config: WebhookConfig, headers: dict[str, str], body: bytes
) -> Attempt:
    """POST once and classify the answer. Redirects are not followed: a signed POST that
    is redirected would become a GET or go to a host the config never named."""
    try:
        async with session.post(
            config.url, data=body, headers=headers, allow_redirects=False
        ) as resp:
            if 200 <= resp.status < 300:
                return Attempt(ok=True, status=resp.status)
            answer = await _read_start(resp.content, ANSWER_BYTES)
            retry_after = None
            if resp.status in (429, 503):
                retry_after = retry_after_s(
                    resp.headers.get("Retry-After"), config.max_retry_after_s
                )
            return Attempt(
                ok=False,
                retry=resp.status == 429 or resp.status >= 500,
                error=f"HTTP {resp.status} {resp.reason or ''}".rstrip(),
                status=resp.status,
                answer=answer.decode("utf-8", "replace"),
                retry_after_s=retry_after,
            )
    except TimeoutError:  # aiohttp's own timeouts derive from it too
        return Attempt(ok=False, retry=True, error=f"no answer within {config.timeout_s:g} s")
    except aiohttp.ClientError as exc:
        return Attempt(ok=False, retry=True, error=describe(exc))


def describe(exc: aiohttp.ClientError) -> str:
    """The failure without the URL that some aiohttp messages carry (InvalidURL's does)."""
    if isinstance(exc, OSError) and exc.strerror:
        return f"{type(exc).__name__}: {exc.strerror}"
    return type(exc).__name__


async def _read_start(content: aiohttp.StreamReader, limit: int) -> bytes:
    data = b""
    while len(data) < limit:
        chunk = await content.read(limit - len(data))
        if not chunk:
            break
        data += chunk
    return data
