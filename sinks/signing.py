"""Signatures that bind a message to a time and an id: one scheme for webhook deliveries
and MQTT commands (docs/security.md, "Signed messages").

    X-Appliance-Signature: t=1764601234,v1=<hex HMAC-SHA256(secret, "<t>.<id>.<body>")>

As Stripe's and Slack's schemes do: the HMAC covers the Unix time `t` (seconds), the
message's id (a webhook's delivery id, an MQTT command's topic) and the body bytes
exactly as sent, so neither a replayed old message nor a body moved to another id
verifies. A receiver accepts `t` within `tolerance_s` of its own clock (default 300 s,
Stripe's) and drops an id it has already seen inside that window (`ReplayGuard`). `v1`
names the scheme: a later one can be sent beside it while receivers move over, and a
sender rotating its key sends two `v1` values, one per key, while receivers move over.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import threading
import time
from collections import OrderedDict

SCHEME = "v1"
DEFAULT_TOLERANCE_S = 300.0  # five minutes, as Stripe's libraries default to
_TIME = re.compile(r"[0-9]{1,12}", re.ASCII)  # Unix seconds: 12 digits last past year 30000
_DIGEST = re.compile(r"[0-9a-fA-F]{64}", re.ASCII)  # HMAC-SHA256, hex


class SignatureError(ValueError):
    """A signature that does not verify; the message says why (never the secret)."""


def signature(secret: bytes, timestamp: int, message_id: str, body: bytes) -> str:
    """The header value `t=<timestamp>,v1=<hex digest>` for one message."""
    return f"t={timestamp},{SCHEME}={digest(secret, timestamp, message_id, body)}"


def sign(secret: bytes, message_id: str, body: bytes, now: float | None = None) -> str:
    """`signature` at the current time (or `now`, Unix seconds)."""
    return signature(secret, int(time.time() if now is None else now), message_id, body)


def verify(
    secret: bytes,
    header: str,
    message_id: str,
    body: bytes,
    *,
    tolerance_s: float = DEFAULT_TOLERANCE_S,
    now: float | None = None,
) -> int:
    """The signed time when `header` signs (`message_id`, `body`) with `secret` within
    `tolerance_s` of `now`; SignatureError otherwise. Compared in constant time."""
    timestamp, digests = _parse(header)
    now = time.time() if now is None else now
    if abs(now - timestamp) > tolerance_s:
        raise SignatureError(
            f"signature time {timestamp} is {now - timestamp:+.0f} s from now "
            f"(tolerance {tolerance_s:.0f} s): a replay or a wrong clock"
        )
    expected = digest(secret, timestamp, message_id, body)
    if not any(hmac.compare_digest(expected, d) for d in digests):
        raise SignatureError("signature does not match (wrong secret, id or body)")
    return timestamp


def digest(secret: bytes, timestamp: int, message_id: str, body: bytes) -> str:
    """The v1 digest (64 hex digits) of `body` with `message_id` at `timestamp`: what a
    signature carries, and what tells one signed message from another."""
    signed = f"{timestamp}.{message_id}.".encode() + body
    return hmac.new(secret, signed, hashlib.sha256).hexdigest()


def _parse(header: str) -> tuple[int, list[str]]:
    """`t=...,v1=...[,v1=...]`: the time and every v1 digest (a key rotation sends two).
    The header is the sender's choice, any text: whatever it holds, a malformed one is a
    SignatureError, never another exception (one escaping here stopped paho's network
    thread). Only ASCII counts: `str.isdigit` takes "²" and `int` the digits of every
    script, and `hmac.compare_digest` refuses non-ASCII text (TypeError)."""
    if not isinstance(header, str):
        raise SignatureError(f"malformed signature: text expected, got {type(header).__name__}")
    timestamp: int | None = None
    digests: list[str] = []
    for part in header.split(",")[:8]:  # a few parts at most: no unbounded work
        key, sep, value = part.strip().partition("=")
        if not sep:
            continue
        if key == "t" and _TIME.fullmatch(value):
            timestamp = int(value)
        elif key == SCHEME and _DIGEST.fullmatch(value):
            digests.append(value.lower())
    if timestamp is None or not digests:
        raise SignatureError(
            f"malformed signature: expected t=<unix time, ASCII digits>,{SCHEME}=<64 hex digits>"
        )
    return timestamp, digests


class ReplayGuard:
    """The message ids accepted within the tolerance window, to drop a second message
    with one: a replay inside the window (or a webhook retry whose 2xx answer was lost).
    Bounded: at most `max_ids` ids, the oldest dropped first, each kept until every
    signature of it is out of the window (a retry is signed afresh: it extends it).
    Thread-safe. `forget` an id whose handling failed, so that its retry is accepted."""

    def __init__(self, tolerance_s: float = DEFAULT_TOLERANCE_S, max_ids: int = 100_000) -> None:
        if tolerance_s <= 0 or max_ids < 1:
            raise ValueError(f"tolerance_s {tolerance_s} must be > 0, max_ids {max_ids} >= 1")
        self._tolerance_s = tolerance_s
        self._max_ids = max_ids
        self._until: OrderedDict[str, float] = OrderedDict()  # id -> when its last verifies
        self._lock = threading.Lock()

    def accept(self, message_id: str, timestamp: int, now: float | None = None) -> bool:
        """True the first time `message_id` comes within the window, False after.
        `timestamp`: the verified signature's time (what `verify` returned)."""
        now = time.time() if now is None else now
        until = timestamp + self._tolerance_s  # a signature at `timestamp` verifies till then
        with self._lock:
            self._expire(now)
            seen = message_id in self._until
            self._until[message_id] = max(until, self._until.get(message_id, until))
            self._until.move_to_end(message_id)
            if len(self._until) > self._max_ids:
                self._until.popitem(last=False)
        return not seen

    def held(self, now: float | None = None) -> list[tuple[str, float]]:
        """The ids held within the window and until when each (Unix seconds), in the
        order they came: what a receiver keeps to hold them across a restart."""
        with self._lock:
            self._expire(time.time() if now is None else now)
            return list(self._until.items())

    def forget(self, message_id: str) -> None:
        """Accept `message_id` again (its handling failed: let its retry through)."""
        with self._lock:
            self._until.pop(message_id, None)

    def __len__(self) -> int:
        with self._lock:
            return len(self._until)

    def _expire(self, now: float) -> None:
        # Ids come in about the order they expire: stop at the first still in the window.
        while self._until:
            oldest, until = next(iter(self._until.items()))
            if until >= now:
                return
            del self._until[oldest]
