"""What every video source looks like, its lifecycle states, and URL handling.

A source yields decoded BGR frames; the grabber thread (grabber.py) owns it, paces it,
reconnects it and reports state changes through a `StateCallback`.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Generator, Iterator
from enum import StrEnum
from typing import Literal, Protocol

# Re-exported (PEP 484 "as" form, for mypy strict): sources and callers import it from here.
from appliance.policy.masking import mask_url as mask_url  # noqa: PLC0414
from appliance.sources.config import URL_KINDS
from pipelines.types import Image

SourceKind = Literal["rtsp", "http", "v4l2", "file"]

# Matched whole (fullmatch), in ASCII digits: `$` would also match before a final newline
# and `\d` any script's digits, and what is no device is a file, for the file policy.
_V4L2_DEVICE = re.compile(r"/dev/video[0-9]{1,3}")


class StreamState(StrEnum):
    """Lifecycle of one stream's source, as reported to the runtime and /health."""

    STARTING = "starting"
    RUNNING = "running"
    RECONNECTING = "reconnecting"
    STOPPED = "stopped"
    FAILED = "failed"
    # Set by the supervisor, not the grabber: the worker (or a read) has been busy on one
    # frame for longer than limits.worker_stall_s. The stream is restarted; this object
    # stays `stalled` so its history says why.
    STALLED = "stalled"


StateCallback = Callable[[StreamState, str], None]
"""Called from the grabber thread with the new state and a human reason (URLs masked)."""


class SourceError(Exception):
    """A source cannot be opened or read; the message never contains credentials."""


class EndOfStreamError(SourceError):
    """A live source's stream ended (RTCP BYE, the server closed the connection, EOF):
    the grabber reconnects at once instead of waiting for the stall timeout. The message
    starts with the masked URL and says `end of stream`, and how the camera ended it."""


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

    @property
    def received_mono(self) -> float:
        """time.perf_counter() when the demuxer handed over the data of the frame `frames`
        yielded last: for a live source, the frame's arrival, before decoding and colour
        conversion (which its age then includes)."""
        ...

    @property
    def decode_errors(self) -> int:
        """Frames that failed to decode and were skipped (the stream went on)."""
        ...

    @property
    def last_decode_error(self) -> str | None:
        """The decoder's message for the last of them (no URL in it)."""
        ...

    @property
    def decoder(self) -> str:
        """What decodes the video, chosen at open: e.g. "h264 cuda", "hevc software"."""
        ...

    @property
    def decoder_problem(self) -> str | None:
        """Why the hardware decoder `source.decoder` asked for was refused (the video is
        decoded in software instead); None when none was asked for, or it was granted."""
        ...

    def frames(self) -> Iterator[tuple[Image, float | None]]:
        """Decoded frames as (BGR uint8 HxWx3 image, pts in seconds or None), in order.

        Ends at the end of a file (or when asked to stop); raises EndOfStreamError at the end
        of a live stream, SourceError when reading or decoding fails.
        """
        ...

    def close(self) -> None:
        """Release the container; safe to call twice."""
        ...


FrameGenerator = Generator[tuple[Image, float | None], None, None]


class DecodingSource:
    """What the decoding sources share: `frames()` hands out one generator (the
    subclass's `_generate`), `close` ends it before anything else is released, and
    `received_mono` is the arrival of the frame it yielded last."""

    _frames: FrameGenerator | None = None
    _received_mono: float = 0.0
    _decode_errors: int = 0
    _last_decode_error: str | None = None
    _decoder_name: str = "unknown"
    _decoder_problem: str | None = None

    @property
    def received_mono(self) -> float:
        return self._received_mono

    @property
    def decoder(self) -> str:
        return self._decoder_name

    @property
    def decoder_problem(self) -> str | None:
        return self._decoder_problem

    @property
    def decode_errors(self) -> int:
        return self._decode_errors

    @property
    def last_decode_error(self) -> str | None:
        return self._last_decode_error

    def frames(self) -> Iterator[tuple[Image, float | None]]:
        """Decoded frames until the end of the stream or `stop`; SourceError on failure."""
        self._frames = self._generate()
        return self._frames

    def _end_frames(self) -> None:
        # A suspended generator still holds the container or session it reads.
        if self._frames is not None:
            self._frames.close()

    def _generate(self) -> FrameGenerator:
        raise NotImplementedError


def source_kind(url: str) -> SourceKind:
    """Which kind of source a configured URL names; anything without a scheme is a file
    (the config refuses a scheme not in URL_KINDS)."""
    scheme, sep, _ = url.partition("://")
    if sep and scheme.lower() in URL_KINDS:
        return URL_KINDS[scheme.lower()]
    if _V4L2_DEVICE.fullmatch(url):
        return "v4l2"
    return "file"
