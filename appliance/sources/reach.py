"""Why a host could not be reached, in a person's words: the name did not resolve, the
connection was refused (nothing listens there), timed out, or the network has no route.
Cameras (appliance/sources/problems.py) and the CLI's client say it the same way; only
host and port are named, never a URL's credentials.
"""

from __future__ import annotations

import socket
from urllib.parse import SplitResult, urlsplit

# Default ports by scheme (RFC 7826 for RTSP/RTSPS, RFC 9110 for HTTP/HTTPS).
_PORTS = {"rtsp": 554, "rtsps": 322, "http": 80, "https": 443}


def endpoint(url: str) -> str:
    """`host:port` of a URL, the scheme's default port when it names none."""
    parts = urlsplit(url)
    host = parts.hostname or "?"
    host = f"[{host}]" if ":" in host else host  # an IPv6 literal
    port = _port(parts)
    return f"{host}:{port}" if port else host


def origin(url: str) -> tuple[str, str, int]:
    """A URL's origin as RFC 6454 has it: scheme, host and port (the scheme's default
    when it names none), compared in lower case. A port that is no number counts as 0."""
    parts = urlsplit(url)
    return parts.scheme.lower(), (parts.hostname or "").lower(), _port(parts)


def _port(parts: SplitResult) -> int:
    """The URL's port, the scheme's default when it names none; 0 when it is no number."""
    try:
        return parts.port or _PORTS.get(parts.scheme.lower(), 0)
    except ValueError:  # a port that is not a number
        return 0


def connect_problem(url: str, cause: BaseException) -> str:
    """A failed connection: the name did not resolve, or the host refused, timed out,
    or cannot be reached."""
    where = endpoint(url)
    if isinstance(cause, socket.gaierror):
        return f"cannot resolve host {urlsplit(url).hostname!r} ({cause.strerror or cause})"
    if isinstance(cause, ConnectionRefusedError):
        return f"cannot connect to {where} (connection refused: nothing listens there)"
    if isinstance(cause, TimeoutError):
        return f"cannot connect to {where} (timed out)"
    if isinstance(cause, OSError) and cause.strerror:  # no route, network unreachable
        return f"cannot connect to {where} ({cause.strerror.lower()})"
    return f"cannot connect to {where} ({cause})"
