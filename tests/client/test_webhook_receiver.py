"""The client's side of webhooks: `verify_webhook` and `ReplayGuard` on deliveries signed
by the sink's own signing code (the sink end to end: tests/sinks/test_webhook.py)."""

from __future__ import annotations

import http.client
import json
import re
import time
import uuid
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from appliance.client import (
    ReplayGuard,
    WebhookDelivery,
    WebhookVerificationError,
    verify_webhook,
)
from sinks.signing import SignatureError, sign, signature
from tests.sinks.receiver import LoopThread, bound_socket

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


# -- malformed headers: always WebhookVerificationError, so a receiver answers 4xx -------------
DIGEST = "0" * 64
LONE_SURROGATE = "\udcb2"  # what a server's surrogateescape makes of a stray 0xB2 byte


@pytest.mark.parametrize(
    ("change", "why"),
    [
        # "²" passes str.isdigit and int() refuses it; "١٢٣" int() reads as 123.
        ({"X-Appliance-Signature": f"t=²,v1={DIGEST}"}, r"malformed signature"),
        ({"X-Appliance-Signature": f"t=١٢٣,v1={DIGEST}"}, r"malformed signature"),
        # compare_digest refuses non-ASCII text (TypeError): a digest is hex, or malformed.
        ({"X-Appliance-Signature": f"t={int(NOW)},v1={'é' * 64}"}, r"malformed signature"),
        (
            {"X-Appliance-Signature": f"t={int(NOW)},v1={LONE_SURROGATE * 64}"},
            r"malformed signature",
        ),
        ({"X-Appliance-Signature": f"t={int(NOW)},v1={'g' * 64}"}, r"malformed signature"),
        ({"X-Appliance-Delivery": "é" * 8}, r"X-Appliance-Delivery: not a delivery id"),
        # What a framework may hand over: values that are not text.
        ({"X-Appliance-Signature": b"t=1,v1=00"}, r"X-Appliance-Signature: not text \(got bytes\)"),
        ({"X-Appliance-Delivery": 42}, r"X-Appliance-Delivery: not text \(got int\)"),
        ({"X-Appliance-Event": ["prediction"]}, r"X-Appliance-Event: not text \(got list\)"),
        ({7: "seven"}, None),  # a name that is not text is not the one looked for
    ],
)
def test_a_malformed_header_is_a_verification_error(
    change: dict[object, object], why: str | None
) -> None:
    bad: dict[Any, Any] = {**headers(), **change}  # whatever a framework hands over
    if why is None:
        assert verify_webhook(SECRET, bad, BODY, now=NOW).id == ID
        return
    with pytest.raises(WebhookVerificationError, match=why):
        verify_webhook(SECRET, bad, BODY, now=NOW)


# -- the receivers docs/outputs.md shows, their code taken from it --------------------------------
OUTPUTS_MD = Path(__file__).resolve().parents[2] / "docs" / "outputs.md"


def docs_code(defines: str, **names: Any) -> dict[str, Any]:
    """Run the Python block of docs/outputs.md that defines `defines` (with `names`
    given, as the reader's program would); its namespace."""
    blocks = re.findall(r"```python\n(.*?)```", OUTPUTS_MD.read_text(encoding="utf-8"), re.S)
    (block,) = [b for b in blocks if f"def {defines}(" in b]
    namespace: dict[str, Any] = dict(names)
    exec(compile(block, str(OUTPUTS_MD), "exec"), namespace)
    return namespace


@pytest.fixture
def docs_receiver() -> Iterator[tuple[int, list[Any]]]:
    """docs/outputs.md's `receive`, answering POSTs to /hook in an aiohttp server on an
    unused 127.0.0.1 port, on its own loop thread; (its port, what it handled)."""
    handled: list[Any] = []
    receive = docs_code("receive", SECRET=SECRET, handle=handled.append)["receive"]

    async def hook(request: web.Request) -> web.Response:
        return web.Response(status=receive(request.headers, await request.read()))

    app = web.Application()
    app.router.add_post("/hook", hook)
    runner = web.AppRunner(app)
    sock = bound_socket()
    with LoopThread("docs-receiver") as loop:
        loop.call(runner.setup())
        loop.call(web.SockSite(runner, sock).start())
        try:
            yield int(sock.getsockname()[1]), handled
        finally:
            loop.call(runner.cleanup())


def post(port: int, headers: Mapping[str, str | bytes], body: bytes = BODY) -> int:
    """POST to the receiver with these header values (bytes sent as they are); its status."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.putrequest("POST", "/hook")
        for name, value in {**headers, "Content-Length": str(len(body))}.items():
            conn.putheader(name, value)
        conn.endheaders(body)
        return conn.getresponse().status
    finally:
        conn.close()


def test_the_docs_receiver_answers_401_not_500_to_malformed_headers(
    docs_receiver: tuple[int, list[Any]],
) -> None:
    """Each request below made the docs' receiver answer 500 (a ValueError or TypeError
    escaped `verify_webhook`); a receiver must answer every bad request 4xx."""
    port, handled = docs_receiver
    fresh = fresh_headers()
    statuses = [post(port, {**fresh, "X-Appliance-Signature": m}) for m in malformed()]
    assert statuses == [401] * len(statuses)
    assert handled == []
    assert post(port, fresh) == 200  # the genuine delivery is taken, once
    assert post(port, fresh) == 200
    assert handled == [json.loads(BODY)]


def test_the_docs_port_raises_only_value_error_on_malformed_headers() -> None:
    """The docs' check without the client, for porting: every malformed header is its
    ValueError (what its reader answers 4xx), and a genuine delivery verifies."""
    verify = docs_code("verify")["verify"]
    fresh = fresh_headers()
    for bad in malformed():
        text = bad.decode("utf-8", "surrogateescape")  # as aiohttp reads the header
        with pytest.raises(ValueError, match="malformed signature"):
            verify(SECRET.encode(), {**fresh, "X-Appliance-Signature": text}, BODY)
    assert verify(SECRET.encode(), fresh, BODY) == fresh["X-Appliance-Delivery"]


def fresh_headers() -> dict[str, str]:
    """A delivery's headers, signed now."""
    delivery_id = uuid.uuid4().hex
    signed = sign(SECRET.encode(), delivery_id, BODY)
    return {**headers(delivery_id=delivery_id), "X-Appliance-Signature": signed}


def malformed() -> list[bytes]:
    """Signature headers as sent on the wire, each malformed."""
    t = int(time.time())
    return [
        f"t=²,v1={DIGEST}".encode(),  # UTF-8 on the wire: the server reads "²"
        f"t={t},v1={'é' * 64}".encode(),
        b"t=%d,v1=" % t + b"\xb2" * 64,  # not UTF-8: read as lone surrogates
        f"t=١٢٣,v1={DIGEST}".encode(),  # digits int() reads
    ]
