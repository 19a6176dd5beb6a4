"""Fuzz target: WebRTC offers, from the request body to the SDP aiortc parses.

- The body (appliance/server/bodies.py `_validate` with schemas.WebRtcOffer, as the
  route runs it): any bytes are a WebRtcOffer or are refused with BadRequestError (400),
  InvalidError or pydantic's ValidationError (422); an `sdp` string validates exactly
  when it has 1 to 64 KiB characters.
- The SDP (appliance/server/webrtc/sessions.py `WebRtcSessions.open`, against a stub
  runtime): any string, and any line-level mutation of a real aiortc offer, is answered
  with an answer SDP or refused with OfferError (400) whose message gives a reason; never
  another exception, never a hang, and no session is left open after a refusal.
Bugs this fuzzing found, both fixed and kept as regression cases in the last section,
each pinned by an `@example`: a 4301-digit integer in the body was a ValueError (500, now
400), and an aiortc error with an empty message gave `invalid SDP offer: ` with no reason.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import example, given
from hypothesis import strategies as st
from pydantic import ValidationError

from appliance.observe.metrics import Metrics
from appliance.server.bodies import _validate
from appliance.server.errors import BadRequestError, InvalidError
from appliance.server.schemas import WebRtcOffer
from appliance.server.webrtc.config import WebRtcConfig
from appliance.server.webrtc.sessions import OfferError, WebRtcSessions
from tests.fuzz.support import DOCUMENTS, fuzz, no_hang

# A real offer made by aiortc (addTransceiver("video", recvonly)), addresses from TEST-NET-1.
OFFER = "\r\n".join([
    "v=0", "o=- 4005083552 4005083552 IN IP4 0.0.0.0", "s=-", "t=0 0",
    "a=group:BUNDLE 0", "a=msid-semantic:WMS *",
    "m=video 34539 UDP/TLS/RTP/SAVPF 97 98 99 100", "c=IN IP4 192.0.2.2", "a=recvonly",
    "a=extmap:1 urn:ietf:params:rtp-hdrext:sdes:mid", "a=mid:0", "a=rtcp:9 IN IP4 0.0.0.0",
    "a=rtcp-mux", "a=rtpmap:97 VP8/90000", "a=rtcp-fb:97 nack", "a=rtcp-fb:97 nack pli",
    "a=rtpmap:98 rtx/90000", "a=fmtp:98 apt=97", "a=rtpmap:99 H264/90000",
    "a=fmtp:99 level-asymmetry-allowed=1;packetization-mode=1;profile-level-id=42e01f",
    "a=rtpmap:100 rtx/90000", "a=fmtp:100 apt=99",
    "a=candidate:f957a2332b1715da 1 udp 2130706431 192.0.2.2 34539 typ host",
    "a=end-of-candidates", "a=ice-ufrag:SUaA", "a=ice-pwd:dup57mY8vyGzp3gKaHakL5",
    "a=fingerprint:sha-256 B2:10:59:3E:3D:B9:81:BE:0B:4C:F4:D6:EE:49:B2:E2:DE:E6:59:A6:34:"
    "0B:14:97:27:F5:7B:46:D6:EC:D6:F6",
    "a=setup:actpass", "",
])  # fmt: skip
LINES = OFFER.split("\r\n")


class StubRuntime:
    """What WebRtcSessions asks of the runtime: one stream that never has a result."""

    metrics = Metrics()

    def has_stream(self, stream_id: str) -> bool:
        return stream_id == "cam"

    def subscribe(self, callback: Callable[..., None], stream_id: str) -> Callable[[], None]:
        return lambda: None

    def hold_video(self, stream_id: str) -> Callable[[], None]:
        return lambda: None


def answer(sdp: str) -> str | OfferError:
    """The answer SDP, or the OfferError that refused the offer; all sessions closed."""

    async def run() -> str | OfferError:
        sessions = WebRtcSessions(StubRuntime(), WebRtcConfig())  # type: ignore[arg-type]
        try:
            _, answered = await sessions.open("cam", sdp, None, None)
            return answered
        except OfferError as exc:
            assert sessions.count() == 0  # a refused offer leaves nothing open
            return exc
        finally:
            await sessions.close_all()

    with no_hang(5.0):
        return asyncio.run(run())


def check_sdp(sdp: str) -> None:
    """Answered, or refused with OfferError whose message gives a reason."""
    result = answer(sdp)
    if isinstance(result, OfferError):
        why = str(result).partition(": ")[2]
        assert str(result).startswith(("invalid SDP offer: ", "the offer has no video",
                                       "cannot answer the offer: ")), str(result)  # fmt: skip
        assert why.strip() or str(result).startswith("the offer"), repr(str(result))
    else:
        assert result.startswith("v=0") and "m=video" in result


def test_the_mutation_seed_is_answered() -> None:
    result = answer(OFFER)
    assert isinstance(result, str) and "a=sendonly" in result


def _mutate(edits: list[tuple[int, str, str]]) -> str:
    lines = list(LINES)
    for where, action, text in edits:
        at = where % len(lines)
        if action == "drop":
            del lines[at]
        elif action == "cut":
            lines[at] = lines[at][: len(text)]
        elif action == "insert":
            lines.insert(at, text)
        else:
            lines[at] = lines[at].split(":", 1)[0] + ":" + text
    return "\r\n".join(lines)


EDITS = st.lists(
    st.tuples(
        st.integers(0, 100),
        st.sampled_from(["drop", "cut", "insert", "value"]),
        st.text(alphabet="am=v0123456789 :/.-xAB\t", max_size=12),
    ),
    min_size=1,
    max_size=3,
)


@fuzz(50)
@given(EDITS.map(_mutate))
def test_mutated_offers(sdp: str) -> None:
    check_sdp(sdp)


@fuzz(50)
@given(st.text(max_size=60) | st.text(max_size=40).map(lambda t: f"v=0\nm={t}"))
def test_any_string_as_sdp(sdp: str) -> None:
    check_sdp(sdp)


BODIES = st.one_of(
    st.binary(max_size=40),
    DOCUMENTS.map(lambda d: json.dumps(d).encode()),
    st.fixed_dictionaries(
        {"sdp": st.text(max_size=20) | DOCUMENTS, "type": st.sampled_from(["offer", "answer"])},
        optional={"max_fps": DOCUMENTS | st.floats(), "max_width": DOCUMENTS | st.integers(),
                  "extra": DOCUMENTS},
    ).map(lambda d: json.dumps(d).encode()),
)  # fmt: skip


def check_body(raw: bytes) -> None:
    try:
        offer = _validate(raw, WebRtcOffer)
    except (BadRequestError, InvalidError, ValidationError):
        return
    body: dict[str, Any] = json.loads(raw)
    assert offer.type == "offer" and offer.sdp == body["sdp"]
    assert 1 <= len(offer.sdp) <= 64 * 1024 and "\x00" not in offer.sdp


@fuzz(300)
@given(BODIES)
def test_any_offer_body(raw: bytes) -> None:
    check_body(raw)


@fuzz(50)
@given(st.text(max_size=30).filter(lambda s: "\x00" not in s))
def test_an_sdp_string_validates_when_not_empty(sdp: str) -> None:
    raw = json.dumps({"sdp": sdp, "type": "offer"}).encode()
    if sdp:
        assert _validate(raw, WebRtcOffer).sdp == sdp
    else:
        with pytest.raises(ValidationError):
            _validate(raw, WebRtcOffer)


# -- once bugs, fixed: regression cases --------------------------------------------------
@fuzz(3)
@example(digits=4301)
@given(st.integers(4301, 5000))
def test_huge_integer_in_a_body(digits: int) -> None:
    check_body(b'{"sdp": "v=0", "type": "offer", "max_width": ' + b"1" * digits + b"}")


@fuzz(5)
@example(sdp="v=0\nm=video")
@given(st.sampled_from(["v=0\nm=video", "v=0\r\nm=video 9", "\nm="]))
def test_refusals_give_a_reason(sdp: str) -> None:
    check_sdp(sdp)
