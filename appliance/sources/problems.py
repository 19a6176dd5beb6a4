"""Why a camera could not be opened, in a person's words rather than a library's: cannot
resolve, cannot connect (refused, timed out, unreachable), no answer, refused the user
(401/403), no such path (404), not speaking RTSP. Both readers use it: ours for RTSP
(aiortsp's exceptions) and FFmpeg's (PyAV's), so one camera fault reads the same whichever
reader met it. Messages hold host and port only, never the URL's credentials.
"""

from __future__ import annotations

import socket
from urllib.parse import urlsplit

import av

from appliance.sources.reach import connect_problem, endpoint

# What to do about an answer, by status (RTSP reuses HTTP's codes, RFC 7826 §17).
STATUS_HINTS = {
    400: "the camera did not understand the request: check the URL",
    401: "wrong or missing user name or password: give them in the URL, "
    "scheme://user:password@host/path",
    403: "this user may not open this path",
    404: "no such path on this server: check the URL's path against the camera's manual",
    429: "too many requests: another client may hold the camera's sessions",
    453: "not enough bandwidth: lower the camera's bitrate or close other sessions",
    454: "the session ended on the camera's side",
    503: "the server is busy or has no stream there yet",
}

# PyAV's exception for each HTTP answer FFmpeg reports (its RTSP client reports RTSP
# answers with the same codes); a class FFmpeg keeps for several codes names a range.
_AV_STATUS: tuple[tuple[type[Exception], str, str], ...] = (
    (av.error.HTTPBadRequestError, "400", "Bad Request"),
    (av.error.HTTPUnauthorizedError, "401", "Unauthorized"),
    (av.error.HTTPForbiddenError, "403", "Forbidden"),
    (av.error.HTTPNotFoundError, "404", "Not Found"),
    (av.error.HTTPTooManyRequestsError, "429", "Too Many Requests"),
    (av.error.HTTPOtherClientError, "4xx", "(a client error)"),
    (av.error.HTTPServerError, "5xx", "(a server error)"),
)


def answered(status: int | str, reason: str) -> str:
    """The server answered with an error status: what it said and what to do."""
    hint = STATUS_HINTS.get(int(status)) if str(status).isdigit() else None
    text = f"{status} {reason}".strip()
    return f"the server answered {text}" + (f" ({hint})" if hint else "")


def not_rtsp(url: str) -> str:
    return f"{endpoint(url)} answered, but not in RTSP (is that the camera's RTSP port?)"


def no_answer(url: str, timeout_s: float) -> str:
    return f"no answer from {endpoint(url)} within {timeout_s:g} s (source.open_timeout_s)"


def ffmpeg_problem(url: str, exc: BaseException) -> str | None:
    """FFmpeg's failure to open a live URL in those words; None when it is none of them
    (the caller keeps FFmpeg's own text)."""
    for kind, status, reason in _AV_STATUS:
        if isinstance(exc, kind):
            return answered(status, reason)
    if isinstance(exc, ConnectionRefusedError | TimeoutError):
        return connect_problem(url, exc)
    if isinstance(exc, av.error.InvalidDataError) and urlsplit(url).scheme.lower() == "rtsp":
        return not_rtsp(url)
    if isinstance(exc, OSError):  # FFmpeg says "Input/output error" for a name it cannot resolve
        return _unresolved(url)
    return None


def _unresolved(url: str) -> str | None:
    host = urlsplit(url).hostname
    if not host:
        return None
    try:
        socket.getaddrinfo(host, None)
    except socket.gaierror as exc:
        return connect_problem(url, exc)
    except (OSError, UnicodeError):
        return None
    return None
