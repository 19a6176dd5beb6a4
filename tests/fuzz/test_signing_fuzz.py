"""Fuzz target: signature headers (sinks/signing.py `verify`, and the client's
`verify_webhook` over it).

Property: for any header text, whatever its characters, `verify` either returns the
signed time or raises SignatureError: never another exception. The header is what any
client that may publish a command, or any HTTP client of a webhook receiver, chooses; a
ValueError or TypeError escaping from it killed paho's network thread (a signed-commands
sink then stopped answering, and said it was still connected) and made a receiver
written as docs/outputs.md shows answer 500.

Bugs these properties caught, fixed and pinned as examples (`@example`): a `t` that
`str.isdigit` takes and `int` refuses (`t=²`, ValueError), digits of other scripts that
`int` reads (`t=١٢٣`: one time, two spellings), a `v1` of 64 non-ASCII characters
(`hmac.compare_digest` refuses to compare them: TypeError), and header values or names
that are not text (TypeError, AttributeError).
"""

from __future__ import annotations

from collections.abc import Mapping
from contextlib import suppress

from hypothesis import example, given
from hypothesis import strategies as st

from appliance.webhook_receiver import WebhookVerificationError, verify_webhook
from sinks.signing import SignatureError, sign, signature, verify
from tests.fuzz.support import fuzz

SECRET = b"fuzz-key"
ID = "0123456789abcdef0123456789abcdef"
BODY = b'{"v":1}'
NOW = 1_764_601_234.0
GOOD = sign(SECRET, ID, BODY, now=NOW)  # t=1764601234,v1=<64 hex>
HEX = "0123456789abcdefABCDEF"

# Pieces of a header: the scheme's own keys and separators, digits of every script, hex,
# and anything else; glued together they reach every branch of the parser.
PIECES = st.one_of(
    st.sampled_from(["t=", "v1=", ",", "=", " ", "t", "v1", "\x00", "²", "١", "٣", "\udcb2"]),
    st.text("0123456789", min_size=1, max_size=14),
    st.text(HEX, min_size=60, max_size=68),
    st.text(st.characters(categories=["Nd", "No", "Nl"]), min_size=1, max_size=14),
    st.text(max_size=70),
)
HEADERS = st.one_of(
    st.text(),
    st.lists(PIECES, max_size=12).map("".join),
    st.tuples(st.text(max_size=16), st.text(max_size=70)).map(lambda p: f"t={p[0]},v1={p[1]}"),
)


def verdict(header: str, now: float = NOW) -> int | None:
    """The signed time, or None for a SignatureError; anything else fails the test."""
    try:
        return verify(SECRET, header, ID, BODY, now=now)
    except SignatureError:
        return None


@fuzz(300)
@example("t=²,v1=" + "0" * 64)
@example("t=1764601234,v1=" + "é" * 64)
@example("t=1764601234,v1=" + "\udcb2" * 64)
@example("t=１７６４６０１２３４,v1=" + "0" * 64)  # fullwidth digits: int() reads them
@example(GOOD.upper())
@given(HEADERS)
def test_any_header_verifies_or_raises_signature_error(header: str) -> None:
    signed_at = verdict(header)
    # Only the genuine signature verifies (a key rotation's second v1 rides along).
    assert signed_at is None or (signed_at == int(NOW) and GOOD.split(",")[1] in header)


@fuzz(200)
@example("²")
@given(st.text(st.characters(categories=["Nd", "No"]), min_size=1, max_size=10))
def test_a_time_is_ascii_digits_only(t: str) -> None:
    """`int` reads the decimal digits of every script (`int("١٢٣") == 123`): a time in
    any of them, though signed correctly for the number it spells, is malformed. One
    spelling per time, and nothing `int` may refuse."""
    try:
        signed_at = int(t)
    except ValueError:
        signed_at = int(NOW)  # "²": a digit to str.isdigit, not to int
    digest = signature(SECRET, signed_at, ID, BODY).partition(",")[2]
    with_t = verdict(f"t={t},{digest}", now=signed_at)
    assert with_t == (signed_at if t.isascii() and len(t) <= 12 else None)


@fuzz(200)
@given(
    st.dictionaries(
        st.one_of(st.text(max_size=24), st.integers(), st.binary()),
        st.one_of(st.text(max_size=80), st.integers(), st.binary(), st.none()),
        max_size=5,
    )
)
@example({"X-Appliance-Delivery": ID, "X-Appliance-Signature": "t=²,v1=" + "0" * 64})
@example({"X-Appliance-Delivery": ID, "X-Appliance-Signature": b"t=1,v1=00"})
@example({"X-Appliance-Delivery": 42, "X-Appliance-Signature": GOOD})
@example({7: "x", "X-Appliance-Delivery": ID})
def test_any_headers_mapping_is_a_delivery_or_a_verification_error(
    headers: Mapping[object, object],
) -> None:
    """Whatever a framework hands over as headers (names and values of any type),
    `verify_webhook` answers a delivery or WebhookVerificationError, never another
    exception: a receiver written as the docs show then answers 4xx, not 500."""
    with suppress(WebhookVerificationError):
        verify_webhook(SECRET, headers, BODY, now=NOW)  # type: ignore[arg-type]
