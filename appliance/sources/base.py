"""What every video source looks like, its lifecycle states, and URL handling.

A source yields decoded BGR frames; the grabber thread (grabber.py) owns it, paces it,
reconnects it and reports state changes through a `StateCallback`.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from enum import StrEnum
from typing import Literal, Protocol

from pipelines.types import Image

SourceKind = Literal["rtsp", "http", "v4l2", "file"]

# scheme://user:pass@host -> scheme://***:***@host. Greedy up to the last "@" before the
# path, so a password containing "@" is masked whole; \s keeps it inside one URL of a text.
_USERINFO = re.compile(r"(?P<scheme>\b[A-Za-z][A-Za-z0-9+.-]*://)[^/\s]*@")
_V4L2_DEVICE = re.compile(r"^/dev/video\d+$")


class StreamState(StrEnum):
    """Lifecycle of one stream's source, as reported to the runtime and /health."""

    STARTING = "starting"
    RUNNING = "running"
    RECONNECTING = "reconnecting"
    STOPPED = "stopped"
    FAILED = "failed"


StateCallback = Callable[[StreamState, str], None]
"""Called from the grabber thread with the new state and a human reason (URLs masked)."""


class SourceError(Exception):
    """A source cannot be opened or read; the message never contains credentials."""


class VideoSource(Protocol):
    """An opened source. Used by one thread at a time: the one that iterates it."""

    @property
    def is_live(self) -> bool:
        """True for cameras and network streams (reconnect), False for files (pace, loop)."""
        ...

    @property
    def fps(self) -> float | None:
        """Nominal frame rate from the container, or None when it does not say."""
        ...

    def frames(self) -> Iterator[tuple[Image, float | None]]:
        """Decoded frames as (BGR uint8 HxWx3 image, pts in seconds or None), in order.

        Ends at the end of the stream (or when asked to stop); raises SourceError when
        reading or decoding fails.
        """
        ...

    def close(self) -> None:
        """Release the container; safe to call twice."""
        ...


def mask_url(text: str) -> str:
    """Replace `user:pass@` of every URL in `text` with `***:***@`.

    Use it on anything that may carry a source URL before it reaches a log, an error
    or a state reason: FFmpeg's error messages include the URL they failed on.
    """
    return _USERINFO.sub(r"\g<scheme>***:***@", text)


def source_kind(url: str) -> SourceKind:
    """Which kind of source a configured URL names; anything without a scheme is a file."""
    lower = url.lower()
    if lower.startswith(("rtsp://", "rtsps://")):
        return "rtsp"
    if lower.startswith(("http://", "https://")):
        return "http"
    if _V4L2_DEVICE.match(url):
        return "v4l2"
    return "file"
