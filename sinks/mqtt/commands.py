"""Commands over MQTT: `<prefix>/cmd/...` requests, checked here, run by the runtime.

Which topics name which command is the handler's to say (`CommandHandler.topics`: the
appliance's command catalogue, appliance/runtime/commands.py), as data: a pattern's
`{name}` levels become arguments, and nothing here knows one command from another.
With the appliance's catalogue:

    <prefix>/cmd/profiling            {"duration_s": 10, "id": "r1"} → on_command("profiling", …)
    <prefix>/cmd/streams/<id>/restart  {} or empty → on_command("restart", {"stream": id})

The answer, `{"ok": true, "command": ..., "result": {...}}` or `{"ok": false, "error": ...}`,
goes to the request's MQTT 5 response topic (with its correlation data) when it has one
under `<prefix>/cmd/response/`, else to `<prefix>/cmd/reply`, echoing the request's `id`
(or `correlation`). The appliance publishes under its own prefix only: a response topic
elsewhere would let any client make it publish, under its identity, where that client may
not. So these are refused with an answer and never reach the handler: a payload that is
too large or not a JSON object, a topic that names no known command, an `id` that is not
an integer or a short printable string (nothing of it is echoed), a response topic outside
`<prefix>/cmd/response/`, correlation data over MAX_CORRELATION_BYTES, a message that
comes retained (a broker sets the retain flag on a retained message it hands to a new
subscription, MQTT 5 §3.3.1.3: kept there, it would run again at every reconnect). `id`
and `correlation` name the request; the handler gets the other keys as the command's
arguments (the runtime validates them as the HTTP API does). A handler's KeyError /
ValueError (an unknown stream, a bad argument) becomes an error answer with its message.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple, Protocol

log = logging.getLogger("sinks.mqtt")

# Runs one command by name with its arguments; its answer's `result`.
RunCommand = Callable[[str, dict[str, Any]], Awaitable[dict[str, Any]]]


class CommandHandler(Protocol):
    """What a sink that takes commands is given: the commands it may route, and how to
    run one. Called on the sink's event loop."""

    @property
    def topics(self) -> Mapping[str, str]:
        """Topic pattern below the prefix (`cmd/streams/{stream}/restart`) -> command name."""

    async def __call__(self, name: str, args: dict[str, Any], /) -> dict[str, Any]:
        """Run command `name`; KeyError / ValueError are answered to the sender."""


REPLY = "cmd/reply"  # under the prefix; our own answers, never read as requests
RESPONSE = "cmd/response"  # under the prefix: the only place MQTT 5 response topics may name
NAMING = ("id", "correlation")  # body keys that name the request; the rest are arguments
MAX_ID_CHARS = 128  # an echoed string id
MAX_ID = 2**63  # an echoed integer id lies in (-MAX_ID, MAX_ID): a 64-bit integer
MAX_CORRELATION_BYTES = 128  # MQTT 5 correlation data echoed with the answer
MAX_RESPONSE_CHARS = 256  # a response topic's levels below <prefix>/cmd/response/
# A broker hands a retained message to every new subscription, the appliance's own on
# each (re)connect: a retained command would run again at every reconnect and restart.
RETAINED = (
    "retained: a command kept by the broker runs again each time the appliance "
    "subscribes; publish commands with retain false"
)


@dataclass(frozen=True, slots=True)
class Request:
    """One command request, checked: `error` set means refuse without running it."""

    command: str  # the command's name, or the unknown topic's rest
    args: dict[str, Any] = field(default_factory=dict)
    error: str | None = None
    reply_topic: str | None = None  # MQTT 5 response topic, when the request gave one
    correlation: bytes | None = None  # MQTT 5 correlation data, echoed with the answer
    request_id: int | str | None = None  # the body's "id" / "correlation", echoed
    auth_refused: bool = False  # refused by commands.auth (mqtt_auth)


def parse(
    rest: str,
    payload: bytes,
    max_bytes: int,
    reply_topic: str | None = None,
    correlation: bytes | None = None,
    *,
    prefix: str,
    topics: CommandTopics,
    retained: bool = False,
) -> Request | None:
    """The request on topic `<prefix>/<rest>`; None for our own answers' topics.
    `retained`: the message came with the retain flag (the broker kept it)."""
    if _is_ours(rest):
        return None
    command, args = topics.route(rest)
    body: dict[str, Any] = {}
    error: str | None = None
    if len(payload) > max_bytes:
        error = f"payload too large: {len(payload)} bytes > {max_bytes}"
    else:
        body, error = _body(payload)
    if error is None and command is None:
        error = f"unknown command topic {rest!r} (known: {topics.known})"
    if error is None and retained:
        error = RETAINED
    request_id, id_error = _request_id(body)
    topic_error = _response_topic_refusal(reply_topic, prefix)
    too_long = correlation is not None and len(correlation) > MAX_CORRELATION_BYTES
    correlation_error = f"correlation data over {MAX_CORRELATION_BYTES} bytes" if too_long else None
    return Request(
        command=command or rest,
        args={**{k: v for k, v in body.items() if k not in NAMING}, **args},
        error=error or id_error or topic_error or correlation_error,
        reply_topic=None if topic_error else reply_topic,
        correlation=None if too_long else correlation,
        request_id=None if id_error else request_id,
    )


def _request_id(body: dict[str, Any]) -> tuple[int | str | None, str | None]:
    """The id to echo (None: none given), or why the request is refused: an id is an
    integer or a string of at most MAX_ID_CHARS printable characters, never a structure."""
    for key in NAMING:
        value = body.get(key)
        if value is None:
            continue
        if isinstance(value, int) and not isinstance(value, bool) and abs(value) < MAX_ID:
            return value, None
        if isinstance(value, str) and len(value) <= MAX_ID_CHARS and value.isprintable():
            return value, None
        return None, (
            f"{key}: an integer or a string of at most {MAX_ID_CHARS} printable "
            f"characters, got {_json_type(value)}"
        )
    return None, None


def _json_type(value: Any) -> str:
    names = {bool: "boolean", int: "integer", float: "number", str: "string", list: "array"}
    kind = names.get(type(value), "object")
    return f"an {kind}" if kind[0] in "aeiou" else f"a {kind}"


def _response_topic_refusal(topic: str | None, prefix: str) -> str | None:
    """Why the MQTT 5 response topic is refused (the answer then goes to cmd/reply)."""
    base = f"{prefix}/{RESPONSE}/"
    if topic is None:
        return None
    below = topic[len(base) :]
    plain = not any(c in below for c in "+#\0")  # paho refuses to publish to a wildcard
    if topic.startswith(base) and 0 < len(below) <= MAX_RESPONSE_CHARS and plain:
        return None
    return (
        f"response topic refused: answers go only to a topic under {base} "
        f"(at most {MAX_RESPONSE_CHARS} characters below it, no wildcards)"
    )


def _is_ours(rest: str) -> bool:
    """Our own answers' topics (cmd/reply, cmd/response/...): never requests."""
    return any(rest == ours or rest.startswith(ours + "/") for ours in (REPLY, RESPONSE))


class Level(NamedTuple):
    """One level of a topic pattern: a literal, or a `{name}` parameter."""

    text: str  # the literal, or the parameter's name
    param: bool

    def __str__(self) -> str:
        return f"<{self.text}>" if self.param else self.text  # as a refusal lists it


class CommandTopics:
    """Topic patterns -> command names, compiled once: `cmd/streams/{stream}/restart`
    matches `cmd/streams/door/restart` as ("restart", {"stream": "door"}). A `{name}`
    level matches any one level; the first pattern that matches wins."""

    def __init__(self, patterns: Mapping[str, str]) -> None:
        self._patterns = [(_levels(p), name) for p, name in patterns.items()]
        shown = sorted("/".join(map(str, levels)) for levels, _ in self._patterns)
        self.known = ", ".join(shown) or "none"  # `cmd/streams/<stream>/restart`, ...

    def route(self, rest: str) -> tuple[str | None, dict[str, Any]]:
        """(command name, the topic's path arguments), or (None, {}) for no command."""
        levels = rest.split("/")
        for pattern, name in self._patterns:
            args = _match(pattern, levels)
            if args is not None:
                return name, args
        return None, {}


def _levels(pattern: str) -> tuple[Level, ...]:
    """A pattern's levels; ValueError for one that could never be a request's topic."""
    if not pattern.startswith("cmd/") or _is_ours(pattern) or any(c in pattern for c in "+#"):
        raise ValueError(f"command topic {pattern!r}: not a topic under cmd/ that requests use")
    levels = tuple(
        Level(level[1:-1], True) if level[:1] + level[-1:] == "{}" else Level(level, False)
        for level in pattern.split("/")
    )
    names = [level.text for level in levels if level.param]
    if any(not n.isidentifier() or n in NAMING for n in names) or len(set(names)) < len(names):
        raise ValueError(f"command topic {pattern!r}: parameters are distinct argument names")
    return levels


def _match(pattern: tuple[Level, ...], levels: list[str]) -> dict[str, Any] | None:
    """The path arguments when `levels` match `pattern`, else None."""
    if len(pattern) != len(levels):
        return None
    args: dict[str, Any] = {}
    for expected, level in zip(pattern, levels, strict=True):
        if expected.param:
            args[expected.text] = level
        elif level != expected.text:
            return None
    return args


NO_TOPICS = CommandTopics({})


def topics_of(handler: CommandHandler | None) -> CommandTopics:
    """The commands `handler` takes, compiled (none without a handler)."""
    return NO_TOPICS if handler is None else CommandTopics(handler.topics)


def _body(payload: bytes) -> tuple[dict[str, Any], str | None]:
    """The JSON object sent ({} for an empty payload), or the reason it is not one."""
    if not payload.strip():
        return {}, None
    try:
        body = json.loads(payload, parse_constant=_no_constant, parse_float=_finite)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        return {}, f"payload is not valid JSON: {exc}"
    except RecursionError:
        return {}, "payload is not valid JSON: nested too deeply"
    except ValueError as exc:  # NaN/Infinity (_no_constant), an integer of > 4300 digits
        return {}, f"payload is not valid JSON: {exc}"
    if not isinstance(body, dict):
        return {}, f"payload must be a JSON object, got {type(body).__name__}"
    return body, None


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON (RFC 8259)")


def _finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):  # 1e999: a float that would be sent back as Infinity
        raise ValueError(f"{text[:20]} is out of range for a double")
    return value


async def answer(request: Request, handler: RunCommand | None) -> dict[str, Any]:
    """Run the request through `handler`; the answer document."""
    reply: dict[str, Any] = {"command": request.command}
    if request.request_id is not None:
        reply["id"] = request.request_id
    error = request.error
    if error is None and handler is None:
        error = "commands are enabled but this appliance has no handler for them"
    if error is None and handler is not None:
        try:
            return {"ok": True, **reply, "result": await handler(request.command, request.args)}
        except (KeyError, ValueError) as exc:
            error = str(exc.args[0]) if exc.args else type(exc).__name__
        except Exception:  # a handler bug: answered and logged, the sink goes on
            log.exception("mqtt command %s failed", request.command)
            error = "internal error (see the appliance log)"
    log.warning("mqtt command %s refused: %s", request.command, error)
    return {"ok": False, **reply, "error": error}
