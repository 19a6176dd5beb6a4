"""For the program that receives the appliance's webhooks: verify a delivery's signature
(docs/outputs.md, "Webhooks") and drop one already handled. It needs sinks/ only, not
the rest of the appliance.

    guard = ReplayGuard()                                        # one per receiver
    delivery = verify_webhook(secret, request.headers, raw_body)  # WebhookVerificationError
    if guard.accept(delivery.id, delivery.timestamp):             # False: seen, skip it
        handle(json.loads(raw_body))

A delivery is signed over its time, its id (`X-Appliance-Delivery`) and its body, and a
retry is signed afresh with the same id: the signature refuses a body moved to another
id and a request replayed after `tolerance_s`; `ReplayGuard` (sinks/signing.py, shared
with MQTT commands) drops one replayed within it, or retried after a lost answer, by id.
Answer such a duplicate 2xx (it was handled: the appliance stops retrying), and
`guard.forget(delivery.id)` one whose handling failed before answering 5xx.
"""

from __future__ import annotations

import string
from collections.abc import Mapping
from dataclasses import dataclass

from sinks.signing import DEFAULT_TOLERANCE_S, ReplayGuard, SignatureError, verify
from sinks.webhook.http import DELIVERY_HEADER, EVENT_HEADER, SIGNATURE_HEADER

__all__ = ["ReplayGuard", "WebhookDelivery", "WebhookVerificationError", "verify_webhook"]

MAX_ID_CHARS = 128  # the appliance sends 32 hex digits; room for a later format
_ID_CHARS = frozenset(string.ascii_letters + string.digits + "_-")  # no '.': see below


class WebhookVerificationError(SignatureError):
    """A delivery that does not verify: a header missing, a bad signature, a time
    outside the tolerance (a replay, or a clock off). Answer it 4xx, never 2xx."""


@dataclass(frozen=True, slots=True)
class WebhookDelivery:
    """A delivery whose signature verified."""

    id: str  # X-Appliance-Delivery: the same on every retry (signed)
    event: str  # X-Appliance-Event, e.g. "prediction" (not signed: the body says what it is)
    timestamp: int  # the signature's Unix time, seconds (signed)


def verify_webhook(
    secret: str | bytes,
    headers: Mapping[str, str],
    body: bytes,
    *,
    tolerance_s: float = DEFAULT_TOLERANCE_S,
    now: float | None = None,
) -> WebhookDelivery:
    """The delivery, when its `X-Appliance-Signature` signs its id and `body` (the raw
    bytes received, before any JSON parsing) with `secret`, at a time within
    `tolerance_s` of `now` (default: this machine's clock); WebhookVerificationError
    saying why otherwise, for every malformed header too (a value that is not text, a
    time that is not ASCII digits, a digest that is not hex): never another exception,
    so a receiver that answers it 4xx answers every bad request so. `headers`: any
    mapping, names matched in any case."""
    signature = _header(headers, SIGNATURE_HEADER)
    delivery_id = _header(headers, DELIVERY_HEADER)
    # The id is signed between '.'s: one with a '.' could shift bytes between id and body.
    if len(delivery_id) > MAX_ID_CHARS or not _ID_CHARS.issuperset(delivery_id):
        raise WebhookVerificationError(f"{DELIVERY_HEADER}: not a delivery id")
    key = secret.encode("utf-8") if isinstance(secret, str) else secret
    try:
        timestamp = verify(key, signature, delivery_id, body, tolerance_s=tolerance_s, now=now)
    except SignatureError as exc:
        raise WebhookVerificationError(f"{SIGNATURE_HEADER}: {exc}") from None
    event = _header(headers, EVENT_HEADER, required=False)
    return WebhookDelivery(delivery_id, event, timestamp)


def _header(headers: Mapping[str, str], name: str, *, required: bool = True) -> str:
    """The header's value, `name` matched in any case; WebhookVerificationError when it
    is missing (and `required`) or is not text: the mapping is whatever the receiver's
    framework hands over, and a delivery's headers are the sender's choice."""
    value: object = headers.get(name)
    if value is None:  # a plain dict keeps the case it was given
        wanted = name.lower()
        value = next(
            (v for k, v in headers.items() if isinstance(k, str) and k.lower() == wanted), None
        )
    if value is not None and not isinstance(value, str):
        raise WebhookVerificationError(f"{name}: not text (got {type(value).__name__})")
    if not value and required:
        raise WebhookVerificationError(f"{name}: missing (not a delivery from the appliance?)")
    return value or ""
