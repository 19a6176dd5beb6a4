"""Fuzz target: MQTT command requests (sinks/mqtt_commands.py `parse` and `answer`).

Any topic rest, payload bytes, size cap, MQTT 5 response topic and correlation data:
`parse` never raises; it returns None only for our own reply topic, else a Request that is
either refused (`error` set, never reaching a handler) or a known command with a JSON
object body; `answer` gives a document the sink's own encoder (sinks.messages.encode)
turns into strict JSON bytes that decode back to it. Known bugs are strict xfails: deep
JSON nesting (RecursionError), an integer past Python's 4300-digit limit (ValueError) and
a lone surrogate in the echoed id (UnicodeEncodeError in the reply's encoding).
"""

from __future__ import annotations

import json
from collections.abc import Coroutine
from typing import Any

from hypothesis import assume, example, given
from hypothesis import strategies as st

from sinks.messages import encode
from sinks.mqtt_commands import REPLY, Request, answer, parse
from tests.fuzz.support import DOCUMENTS, fuzz

TOPICS = st.one_of(
    st.sampled_from(["cmd/profiling", "cmd/streams/cam/restart", REPLY, f"{REPLY}/x"]),
    st.lists(st.sampled_from(["cmd", "streams", "profiling", "restart", "", "x"]), max_size=5).map(
        "/".join
    ),
    st.text(max_size=20),
)
JSON_BODIES = st.dictionaries(st.sampled_from(["id", "correlation", "duration_s", "x"]), DOCUMENTS)
PAYLOADS = st.one_of(
    st.binary(max_size=64),
    JSON_BODIES.map(lambda d: json.dumps(d).encode()),
    DOCUMENTS.map(lambda d: json.dumps(d).encode()),
    st.tuples(JSON_BODIES.map(lambda d: json.dumps(d).encode()), st.integers(0, 40)).map(
        lambda t: t[0][: t[1]]
    ),
)
CORRELATION = st.none() | st.binary(max_size=16)
REPLY_TOPIC = st.none() | st.text(max_size=16)


async def _handler(command: str, args: dict[str, Any]) -> dict[str, Any]:
    if "x" in args:
        raise KeyError(f"unknown {args['x']!r}")
    return {"command": command, "args": sorted(args)}


def run(coro: Coroutine[Any, Any, dict[str, Any]]) -> dict[str, Any]:
    """Drive `answer` (nothing it awaits here suspends): no event loop per example."""
    try:
        coro.send(None)
    except StopIteration as done:
        result: dict[str, Any] = done.value
        return result
    raise AssertionError("answer suspended")


def check(rest: str, payload: bytes, max_bytes: int, topic: str | None, corr: bytes | None) -> None:
    request = parse(rest, payload, max_bytes, topic, corr)
    if rest == REPLY or rest.startswith(REPLY + "/"):
        assert request is None
        return
    assert isinstance(request, Request)
    assert (request.reply_topic, request.correlation) == (topic, corr)
    if request.error is None:
        assert len(payload) <= max_bytes
        assert request.command in ("profiling", "restart")
        assert isinstance(request.args, dict)
    else:
        assert isinstance(request.error, str) and request.error
    for handler in (_handler, None):
        reply = run(answer(request, handler))
        assert reply["command"] == request.command
        runs = request.error is None and handler is not None
        assert reply["ok"] is (runs and "x" not in request.args)  # "x": the handler refuses
        assert reply["ok"] or isinstance(reply["error"], str)
        data = encode(reply)  # the bytes the sink publishes
        assert json.loads(data) == json.loads(json.dumps(reply, allow_nan=True))


@fuzz(200)
@given(TOPICS, PAYLOADS, st.integers(16, 128), REPLY_TOPIC, CORRELATION)
def test_any_request(
    rest: str, payload: bytes, max_bytes: int, topic: str | None, corr: bytes | None
) -> None:
    check(rest, payload, max_bytes, topic, corr)


@fuzz(50)
@given(JSON_BODIES)
def test_a_valid_body_reaches_the_handler(body: dict[str, Any]) -> None:
    """The positive side: a JSON object within the cap on a known topic is run. (NaN and
    infinities are not JSON: they are refused, test_non_finite_id.)"""
    try:
        payload = json.dumps(body, allow_nan=False).encode()
    except ValueError:
        assume(False)
    request = parse("cmd/streams/cam/restart", payload, len(payload), "r/t", b"c")
    assert request is not None and request.error is None
    assert request.args == {**json.loads(payload), "stream": "cam"}  # the topic's id wins
    assert request.request_id == body.get("id", body.get("correlation"))


@fuzz(100)
@given(st.dictionaries(st.sampled_from(["id", "x"]), st.integers() | st.text()))
def test_replies_are_strict_json(body: dict[str, Any]) -> None:
    """Strict (RFC 8259) JSON for finite values: what any MQTT client can parse."""
    request = parse("cmd/profiling", json.dumps(body).encode(), 1 << 20)
    assert request is not None
    reply = run(answer(request, _handler))
    json.loads(encode(reply).decode("utf-8"), parse_constant=_no_constants)


def _no_constants(name: str) -> Any:
    raise AssertionError(f"not strict JSON: {name}")


# -- known bugs ---------------------------------------------------------------------------
@fuzz(5)
@example(depth=1000)
@given(st.integers(1000, 4000))
def test_deep_payload(depth: int) -> None:
    check("cmd/profiling", b"[" * depth, 4096, None, None)


@fuzz(5)
@example(digits=4301)
@given(st.integers(4301, 6000))
def test_huge_integer(digits: int) -> None:
    check("cmd/profiling", b'{"id": ' + b"1" * digits + b"}", 1 << 20, None, None)


@fuzz(10)
@example(code=0xD800)
@given(st.integers(0xD800, 0xDFFF))
def test_surrogate_in_id(code: int) -> None:
    check("cmd/profiling", b'{"id": "\\u%04x"}' % code, 4096, None, None)


@fuzz(5)
@example(token="NaN")
@given(st.sampled_from(["NaN", "Infinity", "-Infinity", "1e999"]))
def test_non_finite_id(token: str) -> None:
    """Not JSON (RFC 8259), so refused, saying why; the refusal itself is strict JSON."""
    request = parse("cmd/profiling", b'{"id": %s}' % token.encode(), 4096)
    assert request is not None and request.error is not None
    assert "not valid JSON" in request.error
    reply = run(answer(request, _handler))
    assert reply["ok"] is False
    json.loads(encode(reply).decode("utf-8"), parse_constant=_no_constants)
