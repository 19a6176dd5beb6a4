"""Fuzz target: MQTT command requests (sinks/mqtt/commands.py `parse` and `answer`).

Any topic rest, payload bytes, size cap, MQTT 5 response topic and correlation data:
`parse` never raises; it returns None only for our own answers' topics, else a Request
that is either refused (`error` set, never reaching a handler) or a known command with a
JSON object body; the answer goes only under the prefix (a response topic elsewhere is
refused), echoes only an integer or a short printable string id and at most 128 bytes of
correlation data; `answer` gives a document the sink's own encoder (sinks.messages.encode)
turns into strict JSON bytes that decode back to it.

Bugs this fuzzing found, all fixed and kept as regression cases in the last section, each
with its first example pinned (`@example`): deep JSON nesting (RecursionError), an integer
past Python's 4300-digit limit (ValueError), a lone surrogate in the id (echoed, it made
the reply unencodable: UnicodeEncodeError; now such an id is refused and not echoed), NaN /
Infinity / 1e999 ids (echoed as non-JSON; now refused).
"""

from __future__ import annotations

import json
from collections.abc import Coroutine
from typing import Any

from hypothesis import assume, example, given
from hypothesis import strategies as st

from appliance.runtime.commands import TOPICS as CATALOGUE_TOPICS
from sinks.messages import encode
from sinks.mqtt.commands import (
    MAX_CORRELATION_BYTES,
    MAX_ID_CHARS,
    REPLY,
    RESPONSE,
    CommandTopics,
    Request,
    answer,
    parse,
)
from tests.fuzz.support import DOCUMENTS, fuzz

PREFIX = "t"
COMMANDS = CommandTopics(CATALOGUE_TOPICS)  # the appliance's catalogue, as the sink gets it
OURS = (REPLY, RESPONSE)  # our answers' topics, below the prefix: never requests
TOPICS = st.one_of(
    st.sampled_from(["cmd/profiling", "cmd/streams/cam/restart", REPLY, f"{REPLY}/x"]),
    st.sampled_from([RESPONSE, f"{RESPONSE}/x", "cmd/responses"]),
    st.lists(
        st.sampled_from(["cmd", "streams", "profiling", "restart", "response", "", "x"]),
        max_size=5,
    ).map("/".join),
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
CORRELATION = st.none() | st.binary(max_size=16) | st.binary(min_size=120, max_size=140)
REPLY_TOPIC = st.one_of(
    st.none(),
    st.text(max_size=16),
    st.text(max_size=12).map(f"{PREFIX}/{RESPONSE}/".__add__),
    st.sampled_from([f"{PREFIX}/{RESPONSE}", f"{PREFIX}/{REPLY}", "other/cmd/response/x"]),
)
ID_KEYS = ("id", "correlation")


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
    request = parse(rest, payload, max_bytes, topic, corr, prefix=PREFIX, topics=COMMANDS)
    if any(rest == ours or rest.startswith(ours + "/") for ours in OURS):
        assert request is None
        return
    assert isinstance(request, Request)
    # Answers stay under the prefix; correlation data is echoed only when short.
    assert request.reply_topic in (None, topic)
    assert request.reply_topic is None or request.reply_topic.startswith(f"{PREFIX}/{RESPONSE}/")
    assert request.correlation in (None, corr)
    assert corr is None or len(corr) > MAX_CORRELATION_BYTES or request.correlation == corr
    assert not set(ID_KEYS) & set(request.args)  # they name the request, not arguments
    if request.error is None:
        assert len(payload) <= max_bytes
        assert request.command in CATALOGUE_TOPICS.values()
        assert isinstance(request.args, dict)
    else:
        assert isinstance(request.error, str) and request.error
    for handler in (_handler, None):
        reply = run(answer(request, handler))
        assert reply["command"] == request.command
        runs = request.error is None and handler is not None
        assert reply["ok"] is (runs and "x" not in request.args)  # "x": the handler refuses
        assert reply["ok"] or isinstance(reply["error"], str)
        assert _echoable(reply.get("id"))
        data = encode(reply)  # the bytes the sink publishes
        assert json.loads(data) == json.loads(json.dumps(reply, allow_nan=True))


def _echoable(value: Any) -> bool:
    """None (nothing echoed), an integer or a short printable string: never a structure."""
    if isinstance(value, str):
        return len(value) <= MAX_ID_CHARS and value.isprintable()
    return value is None or (isinstance(value, int) and not isinstance(value, bool))


@fuzz(200)
@given(TOPICS, PAYLOADS, st.integers(16, 128), REPLY_TOPIC, CORRELATION)
def test_any_request(
    rest: str, payload: bytes, max_bytes: int, topic: str | None, corr: bytes | None
) -> None:
    check(rest, payload, max_bytes, topic, corr)


PRINTABLE = st.characters(codec="utf-8", categories=["L", "N", "P", "S"], include_characters=" ")
IDS = st.integers(-(2**63) + 1, 2**63 - 1) | st.text(PRINTABLE, max_size=MAX_ID_CHARS)


@fuzz(50)
@given(
    st.dictionaries(st.sampled_from(ID_KEYS), IDS),
    st.dictionaries(st.sampled_from(["duration_s", "x"]), DOCUMENTS),
)
def test_a_valid_body_reaches_the_handler(names: dict[str, Any], args: dict[str, Any]) -> None:
    """The positive side: a JSON object within the cap on a known topic, named by a
    short id, is run with the other keys as arguments. (NaN and infinities are not JSON:
    they are refused, test_non_finite_id.)"""
    try:
        payload = json.dumps({**args, **names}, allow_nan=False).encode()
    except ValueError:
        assume(False)
    topic = f"{PREFIX}/{RESPONSE}/me"
    restart = "cmd/streams/cam/restart"
    request = parse(restart, payload, len(payload), topic, b"c", prefix=PREFIX, topics=COMMANDS)
    assert request is not None and request.error is None
    sent = {k: v for k, v in json.loads(payload).items() if k not in ID_KEYS}
    assert request.args == {**sent, "stream": "cam"}  # the topic's stream id wins
    assert request.request_id == names.get("id", names.get("correlation"))
    assert (request.reply_topic, request.correlation) == (topic, b"c")


@fuzz(50)
@given(
    st.sampled_from(ID_KEYS), DOCUMENTS.filter(lambda v: isinstance(v, list | dict | float | bool))
)
def test_a_structured_id_is_refused_and_not_echoed(key: str, value: Any) -> None:
    """An id that is an array, object, number or boolean is refused, and nothing of it
    comes back: the appliance echoes no structure a sender chose."""
    try:
        payload = json.dumps({key: value, "duration_s": 1}, allow_nan=False).encode()
    except ValueError:
        assume(False)
    request = parse("cmd/profiling", payload, 1 << 20, prefix=PREFIX, topics=COMMANDS)
    assert request is not None and request.error is not None
    reply = run(answer(request, _handler))
    assert reply["ok"] is False and "id" not in reply
    assert request.error.startswith(f"{key}: an integer or a string")


@fuzz(100)
@given(st.dictionaries(st.sampled_from(["id", "x"]), st.integers() | st.text()))
def test_replies_are_strict_json(body: dict[str, Any]) -> None:
    """Strict (RFC 8259) JSON for finite values: what any MQTT client can parse."""
    request = parse(
        "cmd/profiling", json.dumps(body).encode(), 1 << 20, prefix=PREFIX, topics=COMMANDS
    )
    assert request is not None
    reply = run(answer(request, _handler))
    json.loads(encode(reply).decode("utf-8"), parse_constant=_no_constants)


def _no_constants(name: str) -> Any:
    raise AssertionError(f"not strict JSON: {name}")


# -- once bugs, fixed: regression cases --------------------------------------------------
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
    payload = b'{"id": %s}' % token.encode()
    request = parse("cmd/profiling", payload, 4096, prefix=PREFIX, topics=COMMANDS)
    assert request is not None and request.error is not None
    assert "not valid JSON" in request.error
    reply = run(answer(request, _handler))
    assert reply["ok"] is False
    json.loads(encode(reply).decode("utf-8"), parse_constant=_no_constants)


@fuzz(100)
@given(TOPICS, PAYLOADS)
def test_a_retained_request_never_runs(rest: str, payload: bytes) -> None:
    """A message the broker hands over as retained is refused whatever it holds: kept
    there, it would run again each time the appliance subscribes."""
    request = parse(rest, payload, 4096, prefix=PREFIX, topics=COMMANDS, retained=True)
    assert request is None or request.error is not None
