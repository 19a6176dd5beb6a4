"""Commands over MQTT: `<prefix>/cmd/...` requests, checked here, run by the runtime.

    <prefix>/cmd/profiling            {"duration_s": 10, "id": "r1"} → on_command("profiling", …)
    <prefix>/cmd/streams/<id>/restart  {} or empty → on_command("restart", {"stream": id})

The answer, `{"ok": true, "command": ..., "result": {...}}` or `{"ok": false, "error": ...}`,
goes to the request's MQTT 5 response topic (with its correlation data) when it has one,
else to `<prefix>/cmd/reply`, echoing the request's `id` (or `correlation`). A payload that
is too large, not a JSON object, or names no known command is refused with an answer and
never reaches the handler; a handler's KeyError / ValueError (an unknown stream, a bad
argument) becomes an error answer with its message.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

CommandHandler = Callable[[str, dict[str, Any]], Awaitable[dict[str, Any]]]

log = logging.getLogger("sinks.mqtt")

REPLY = "cmd/reply"  # under the prefix; our own answers, never read as requests


@dataclass(frozen=True, slots=True)
class Request:
    """One command request, checked: `error` set means refuse without running it."""

    command: str  # "profiling", "restart", or the unknown topic's rest
    args: dict[str, Any] = field(default_factory=dict)
    error: str | None = None
    reply_topic: str | None = None  # MQTT 5 response topic, when the request gave one
    correlation: bytes | None = None  # MQTT 5 correlation data, echoed with the answer
    request_id: Any = None  # the body's "id" / "correlation", echoed in the answer


def parse(
    rest: str,
    payload: bytes,
    max_bytes: int,
    reply_topic: str | None = None,
    correlation: bytes | None = None,
) -> Request | None:
    """The request on topic `<prefix>/<rest>`; None for our own reply topic."""
    if rest == REPLY or rest.startswith(REPLY + "/"):
        return None
    command, args = _route(rest)
    body: dict[str, Any] = {}
    error: str | None = None
    if len(payload) > max_bytes:
        error = f"payload too large: {len(payload)} bytes > {max_bytes}"
    else:
        body, error = _body(payload)
    if error is None and command is None:
        error = f"unknown command topic {rest!r} (known: cmd/profiling, cmd/streams/<id>/restart)"
    return Request(
        command=command or rest,
        args={**body, **args},
        error=error,
        reply_topic=reply_topic,
        correlation=correlation,
        request_id=body.get("id", body.get("correlation")),
    )


def _route(rest: str) -> tuple[str | None, dict[str, Any]]:
    levels = rest.split("/")
    if levels == ["cmd", "profiling"]:
        return "profiling", {}
    if len(levels) == 4 and levels[:2] == ["cmd", "streams"] and levels[3] == "restart":
        return "restart", {"stream": levels[2]}
    return None, {}


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


async def answer(request: Request, handler: CommandHandler | None) -> dict[str, Any]:
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
