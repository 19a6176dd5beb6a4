"""One webhook POST and what its outcome means: the config, the request's headers and
signature, and the classification of the answer (sent, retry, or give up).

Semantics, as GitHub's and Stripe's webhooks have them: every attempt of one delivery
carries the same `X-Appliance-Delivery` id so a receiver can drop duplicates, and is
signed afresh (`X-Appliance-Signature: t=<unix>,v1=<hex>`, sinks/signing.py) over its
time, that id and the body, so a receiver can refuse a replay; 2xx is success, 429 and
5xx and network failures are retried, any other answer is final.
"""

from __future__ import annotations

from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Annotated, Literal
from urllib.parse import urlsplit

import aiohttp
from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator, model_validator

from sinks import signing
from sinks.webhook.deadletter import DeadLetterConfig, MiB
from sinks.webhook.retry import BackoffConfig, retry_after_s

ANSWER_BYTES = 1024  # of a refused answer kept for the dead letter: enough for an error
EVENT_HEADER = "X-Appliance-Event"  # "prediction"
DELIVERY_HEADER = "X-Appliance-Delivery"  # the delivery's id, the same on every attempt
SIGNATURE_HEADER = "X-Appliance-Signature"  # sinks.signing's `t=...,v1=...`
RESERVED_HEADERS = frozenset(
    h.lower() for h in ("Content-Type", EVENT_HEADER, DELIVERY_HEADER, SIGNATURE_HEADER)
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
    # The HMAC key of X-Appliance-Signature; never logged, never in status or repr.
    secret: Annotated[SecretStr | None, Field(min_length=1, repr=False)] = None
    # The key read from a file instead (a mounted Kubernetes or Docker secret): the
    # appliance reads it through its file policy when the sink starts.
    secret_file: Path | None = None
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

    @model_validator(mode="after")
    def _one_secret(self) -> WebhookConfig:
        if self.secret is not None and self.secret_file is not None:
            raise ValueError("secret and secret_file: give one")
        return self


def safe_url(url: str) -> str:
    """`scheme://host:port/path` only: userinfo and query may hold credentials, and
    sinks/ cannot use appliance.policy.masking (imports run one way)."""
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
    """The request's headers, signed now: the signature covers the current time, the
    delivery id and exactly `body`, the bytes sent."""
    headers = {
        **config.headers,
        "Content-Type": "application/json",
        "User-Agent": USER_AGENT,
        EVENT_HEADER: event,
        DELIVERY_HEADER: delivery_id,
    }
    if config.secret is not None:
        key = config.secret.get_secret_value().encode("utf-8")
        headers[SIGNATURE_HEADER] = signing.sign(key, delivery_id, body)
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
