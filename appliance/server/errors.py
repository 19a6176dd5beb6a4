"""Exceptions → HTTP answers, in one place (Starlette's `_exception_handler.py` practice).

Every error leaves as `{"error": {"code", "message", "details"}}`; `details` is a list of
`location: message` strings (empty when there is nothing more to say). Bad input is never
a 500: the runtime's own failures map by type below, aiohttp's (unknown route, wrong
method, body too large) are rewritten as JSON, and anything else is a logged 500.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from aiohttp import web
from pydantic import ValidationError

from appliance.config import ConfigError
from appliance.errors import (
    FileAccessError,
    FrameNotHeldError,
    LimitError,
    NoResultError,
    NoRollbackError,
    NoShadowError,
    PromotionRefusedError,
    ReloadError,
    ShadowExistsError,
    StateSaveError,
    StreamExistsError,
    UnknownSessionError,
    UnknownStreamError,
    UnknownWindowError,
    WindowBusyError,
    WindowNotReadyError,
    WindowRequestError,
)
from appliance.models.errors import ModelLoadError
from appliance.policy.masking import mask_url
from appliance.runtime.oneshot import ImageDecodeError
from pipelines.errors import WorkflowError, format_location, pydantic_message

log = logging.getLogger("appliance.server")

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
# The counters of refused requests, by name ("limit_hits", "file_refusals"): set by the app.
REFUSALS = web.AppKey("refusals", dict[str, Any])

# Status → code, for aiohttp's own HTTPExceptions and ours alike (docs/api.md, "Errors").
CODES = {
    400: "bad_request",
    401: "unauthorized",
    403: "forbidden",
    404: "not_found",
    405: "method_not_allowed",
    408: "request_timeout",
    409: "conflict",
    413: "payload_too_large",
    415: "unsupported_media_type",
    422: "invalid",
    429: "too_many_requests",
    500: "internal",
    501: "not_implemented",
    503: "unavailable",
}


LIMIT_HINT = " (server.max_body_bytes)"


class ApiError(Exception):
    """A request the server refuses itself: status, message, details, extra headers."""

    status = 400

    def __init__(
        self,
        message: str,
        details: Sequence[str] = (),
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.details = list(details)
        self.headers = headers or {}


class BadRequestError(ApiError):
    status = 400


class UnauthorizedError(ApiError):
    status = 401


class ForbiddenError(ApiError):
    """A valid token whose role is too low for the route (auth.py)."""

    status = 403


class PayloadTooLargeError(ApiError):
    status = 413

    def __init__(self, limit: int) -> None:
        super().__init__(f"Maximum request body size {limit} exceeded{LIMIT_HINT}")


class UnsupportedMediaTypeError(ApiError):
    status = 415


class InvalidError(ApiError):
    status = 422


# The runtime's failures by type; the first match wins (subclasses before bases).
_BY_TYPE: tuple[tuple[type[Exception], int], ...] = (
    (UnknownStreamError, 404),
    (NoResultError, 404),
    (FrameNotHeldError, 404),
    (StreamExistsError, 409),
    (NoShadowError, 404),
    (ShadowExistsError, 409),
    (PromotionRefusedError, 409),
    (NoRollbackError, 404),
    (ReloadError, 409),
    (StateSaveError, 503),  # the change was undone: retry once the folder is fixed
    (UnknownWindowError, 404),
    (UnknownSessionError, 404),
    (WindowBusyError, 409),
    (WindowNotReadyError, 409),
    (WindowRequestError, 422),
    (ConfigError, 422),
    (WorkflowError, 422),
    (ModelLoadError, 422),
    (ValidationError, 422),
    (ImageDecodeError, 400),
    (json.JSONDecodeError, 400),
)


def error_response(
    status: int, message: str, details: Sequence[str] = (), headers: dict[str, str] | None = None
) -> web.Response:
    """The JSON error answer. Message and details are masked as a last guard: a
    validation message may echo the input, such as a source URL with its password."""
    code = CODES.get(status, "bad_request" if status < 500 else "internal")
    masked = [mask_url(d) for d in details]
    body = {"error": {"code": code, "message": mask_url(message), "details": masked}}
    return web.json_response(body, status=status, headers=headers)


def details_of(exc: Exception, status: int) -> list[str]:
    """Every `location: message` an exception carries; a 422 always lists at least one
    (a ModelLoadError's message names its model and file)."""
    if isinstance(exc, ConfigError | WorkflowError):
        return list(exc.problems)
    if isinstance(exc, ValidationError):
        return [f"{format_location(e['loc'])}: {pydantic_message(e)}" for e in exc.errors()]
    if isinstance(exc, WindowBusyError):
        return [exc.running_id]  # the window to wait for
    if isinstance(exc, FrameNotHeldError):  # where the stream's trace still begins
        return [] if exc.oldest is None else [f"oldest_seq: {exc.oldest}"]
    return [_headline(exc)] if status == 422 else []


def _headline(exc: Exception) -> str:
    """The first line: ConfigError and WorkflowError list their problems below it."""
    if isinstance(exc, ValidationError):
        return f"{exc.error_count()} invalid value(s) in the request body"
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def from_http_exception(request: web.Request, exc: web.HTTPException) -> web.Response:
    """aiohttp's plain-text errors as ours, keeping headers such as `Allow`."""
    kept = {k: v for k, v in exc.headers.items() if k.lower() in ("allow", "www-authenticate")}
    if exc.status == 404:
        message = f"no route {request.method} {request.path}"
    elif exc.status == 405:
        allowed = ", ".join(sorted(getattr(exc, "allowed_methods", ())))
        message = f"{request.method} is not allowed on {request.path} (allowed: {allowed})"
    else:
        message = exc.text.removeprefix(f"{exc.status}: ") if exc.text else exc.reason
        message += LIMIT_HINT if exc.status == 413 else ""
    return error_response(exc.status, message, headers=kept)


def from_exception(request: web.Request, exc: Exception) -> web.Response:
    if isinstance(exc, ApiError):
        return error_response(exc.status, exc.message, exc.details, exc.headers)
    if isinstance(exc, LimitError):
        return _limit_response(request, exc)
    if isinstance(exc, FileAccessError):
        _count(request, "file_refusals", exc.kind)
        return error_response(exc.status, str(exc), [f"{exc.where or exc.kind}: {exc.rule}"])
    for kind, status in _BY_TYPE:
        if isinstance(exc, kind):
            return error_response(status, _headline(exc), details_of(exc, status))
    log.error("%s %s failed", request.method, request.path, exc_info=exc)
    return error_response(500, f"internal error ({type(exc).__name__}); see the server log")


def _limit_response(request: web.Request, exc: LimitError) -> web.Response:
    _count(request, "limit_hits", exc.limit)
    headers = {}
    if exc.retry_after_s is not None:  # whole seconds (RFC 9110 10.2.3), at least 1
        headers["Retry-After"] = str(max(1, math.ceil(exc.retry_after_s)))
    return error_response(exc.status, str(exc), [f"{exc.limit}: {exc.value}"], headers)


def _count(request: web.Request, counter: str, label: str) -> None:
    """Refusals are counted where they are answered: one place for every route."""
    counters = request.app.get(REFUSALS)
    if counters is not None:
        counters[counter].labels(label).inc()


@web.middleware
async def error_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """The outermost middleware: whatever a handler or aiohttp raises becomes JSON."""
    try:
        return await handler(request)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise  # redirects and the like are answers, not errors
        return from_http_exception(request, exc)
    except ConnectionError as exc:
        if not _client_left(request):
            return from_exception(request, exc)
        # Nobody to answer, and nothing wrong here: aiohttp ends the connection quietly.
        # An ERROR with its traceback for each would let any client fill the log.
        log.debug("%s %s: the client left (%s)", request.method, request.path, exc)
        raise
    except Exception as exc:
        return from_exception(request, exc)


def _client_left(request: web.Request) -> bool:
    transport = request.transport
    return transport is None or transport.is_closing()
