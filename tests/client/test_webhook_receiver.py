"""The client's side of webhooks: `verify_webhook` and `ReplayGuard` on deliveries signed
by the sink's own signing code (the sink end to end: tests/sinks/test_webhook.py)."""

from __future__ import annotations

import pytest

from appliance.client import (
    ReplayGuard,
    WebhookDelivery,
    WebhookVerificationError,
    verify_webhook,
)
from sinks.signing import SignatureError, sign, signature

SECRET = "receiver-key-1"
ID = "0123456789abcdef0123456789abcdef"  # as the sink makes them: uuid4 hex
BODY = b'{"v":1,"stream":"cam","seq":7,"capture_time":1764601234.5}'
NOW = 1_764_601_234.0


def headers(secret: str = SECRET, delivery_id: str = ID, body: bytes = BODY) -> dict[str, str]:
    """A delivery's headers as the sink sends them, signed at NOW."""
    return {
        "X-Appliance-Event": "prediction",
        "X-Appliance-Delivery": delivery_id,
        "X-Appliance-Signature": sign(secret.encode(), delivery_id, body, now=NOW),
    }


def test_a_delivery_verifies_with_headers_in_any_case() -> None:
    want = WebhookDelivery(ID, "prediction", int(NOW))
    assert verify_webhook(SECRET, headers(), BODY, now=NOW) == want
    lower = {k.lower(): v for k, v in headers().items()}  # as most servers hand them over
    assert verify_webhook(SECRET.encode(), lower, BODY, now=NOW + 299) == want


@pytest.mark.parametrize(
    ("change", "why"),
    [
        ({"X-Appliance-Signature": None}, r"X-Appliance-Signature: missing"),
        ({"X-Appliance-Delivery": None}, r"X-Appliance-Delivery: missing"),
        ({"X-Appliance-Delivery": ID + ".x"}, r"X-Appliance-Delivery: not a delivery id"),
        ({"X-Appliance-Delivery": "a" * 129}, r"X-Appliance-Delivery: not a delivery id"),
        # The body-only form this scheme replaced: replayable, so not accepted.
        ({"X-Appliance-Signature": "sha256=" + "0" * 64}, r"malformed signature"),
        ({"X-Appliance-Signature": f"t=abc,v1={'0' * 64}"}, r"malformed signature"),
        ({"X-Appliance-Signature": f"t={int(NOW)},v1={'0' * 64}"}, r"does not match"),
    ],
)
def test_a_bad_delivery_is_refused_saying_why(change: dict[str, str | None], why: str) -> None:
    bad = {k: v for k, v in {**headers(), **change}.items() if v is not None}
    with pytest.raises(WebhookVerificationError, match=why) as caught:
        verify_webhook(SECRET, bad, BODY, now=NOW)
    assert isinstance(caught.value, SignatureError) and isinstance(caught.value, ValueError)
    assert SECRET not in str(caught.value)


def test_the_time_must_be_within_the_tolerance_either_way() -> None:
    for now in (NOW + 301, NOW - 301):  # replayed late, or a clock far ahead of this one
        with pytest.raises(WebhookVerificationError, match=r"tolerance 300 s"):
            verify_webhook(SECRET, headers(), BODY, now=now)
    verify_webhook(SECRET, headers(), BODY, now=NOW + 50, tolerance_s=60)
    # The time is signed: a replay re-dated to look fresh does not verify.
    later = int(NOW) + 400
    redated = headers()["X-Appliance-Signature"].replace(f"t={int(NOW)}", f"t={later}")
    with pytest.raises(WebhookVerificationError, match="does not match"):
        verify_webhook(SECRET, {**headers(), "X-Appliance-Signature": redated}, BODY, now=later)
    with pytest.raises(WebhookVerificationError, match=r"tolerance 60 s"):
        verify_webhook(SECRET, headers(), BODY, now=NOW + 61, tolerance_s=60)


def test_a_rotated_key_verifies_while_both_are_sent() -> None:
    """A sender moving to a new key sends one v1 per key; either key verifies."""
    t = int(NOW)
    old, new = (signature(k.encode(), t, ID, BODY) for k in ("old-key", "new-key"))
    both = {**headers(), "X-Appliance-Signature": f"{old},v1={new.split('v1=')[1]}"}
    for key in ("old-key", "new-key"):
        assert verify_webhook(key, both, BODY, now=NOW).id == ID
    with pytest.raises(WebhookVerificationError, match="does not match"):
        verify_webhook("third-key", both, BODY, now=NOW)


def test_the_replay_guard_drops_an_id_seen_within_the_window() -> None:
    guard = ReplayGuard(tolerance_s=300)
    assert guard.accept(ID, int(NOW), now=NOW)
    assert not guard.accept(ID, int(NOW), now=NOW + 10)  # replayed within the window
    assert guard.accept("another", int(NOW), now=NOW + 10)
    # Past the window the signature no longer verifies, so the id need not be kept.
    assert guard.accept("later", int(NOW) + 400, now=NOW + 400)
    assert len(guard) == 1


def test_a_retry_signed_later_keeps_its_id_in_the_guard_longer() -> None:
    guard = ReplayGuard(tolerance_s=300)
    assert guard.accept(ID, int(NOW), now=NOW)
    assert not guard.accept(ID, int(NOW) + 200, now=NOW + 200)  # the retry, signed afresh
    # Its signature verifies until NOW + 500: a replay of it then is still dropped.
    assert not guard.accept(ID, int(NOW) + 200, now=NOW + 450)


def test_the_replay_guard_is_bounded_and_forgets_on_request() -> None:
    guard = ReplayGuard(tolerance_s=300, max_ids=3)
    for i in range(5):
        assert guard.accept(f"id{i}", int(NOW), now=NOW)
    assert len(guard) == 3  # the oldest two went first
    assert guard.accept("id0", int(NOW), now=NOW)
    assert not guard.accept("id4", int(NOW), now=NOW)
    guard.forget("id4")  # its handling failed: the retry must get through
    assert guard.accept("id4", int(NOW), now=NOW)
    with pytest.raises(ValueError, match="max_ids"):
        ReplayGuard(max_ids=0)
