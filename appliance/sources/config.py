"""A stream's `source:` (the config's `streams[].source`, and `tuning.sources`), validated
once: where frames come from, how the reader takes them, and how it reconnects.

The URL checks refuse a source that FFmpeg would read otherwise than it looks (a scheme we
do not read, a missing "//", whitespace, a port that is no number) before anything opens it.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated, Literal
from urllib.parse import urlsplit

from pydantic import Field, field_validator

from appliance.policy.hosts import url_host
from appliance.policy.masking import mask_one_url
from appliance.strict import Strict

# The URL schemes a reader takes, by the kind of source they name (sources.source_kind);
# other text is a file's path or a /dev/videoN.
URL_KINDS: dict[str, Literal["rtsp", "http"]] = {
    "rtsp": "rtsp",
    "rtsps": "rtsp",
    "http": "http",
    "https": "http",
}

# RTSP only. auto: H.264/H.265 cameras are read by our RTP reader, which decodes a frame as
# soon as its last packet arrives (FFmpeg's waits for the next frame's first packet: one
# frame interval later); other codecs, or any FFmpeg `options`, go to FFmpeg's reader.
# ffmpeg: always FFmpeg's reader.
Reader = Literal["auto", "ffmpeg"]
# The H.264/H.265 decoder's slice threads; 0: FFmpeg's choice (one per core).
DecoderThreads = Annotated[int, Field(ge=0, le=64)]
# Hardware decoding. none: FFmpeg's software decoder. cuda: NVDEC on `device`, and when
# that device cannot be opened, software decoding with a warning (the stream still
# runs). auto: NVDEC where a CUDA device opens, else software, said at INFO.
HWAccelName = Literal["auto", "cuda", "none"]


class DecoderConfig(Strict):
    """How a stream's video is decoded (`source.decoder`).

    The default is `none`: every NVDEC session opens its own CUDA context on the GPU
    (device memory per stream, beside the models'), and its frames still come back to
    host memory for the BGR conversion; whether that pays is a capacity decision for
    each deployment, not one an upgrade should make silently.
    """

    hwaccel: HWAccelName = "none"
    device: Annotated[int, Field(ge=0, le=63)] = 0  # the CUDA device index (nvidia-smi's)


class SourceTlsConfig(Strict):
    """How an `https://` or `rtsps://` camera's certificate is checked (`source.tls`),
    before any request, and so its credentials, is sent (appliance/sources/tls.py)."""

    # false: any certificate is accepted, so whoever answers at the camera's address gets
    # its credentials; a WARNING names the stream each time it starts.
    verify: bool = True
    # The CA certificates (PEM) trusted for this camera instead of the system's store; a
    # camera's self-signed certificate is its own CA. A relative path starts at the
    # config's folder; over the API, it must lie under the file roots.
    ca_file: Path | None = None


class BackoffConfig(Strict):
    """Capped exponential backoff with jitter between reconnect attempts."""

    initial_s: Annotated[float, Field(gt=0)] = 0.5
    max_s: Annotated[float, Field(gt=0)] = 10.0
    multiplier: Annotated[float, Field(ge=1)] = 2.0
    jitter: Annotated[float, Field(ge=0, le=1)] = 0.2  # +- fraction of the delay


class SourceConfig(Strict):
    """One stream's source: a camera's URL, a video file or a /dev/videoN."""

    url: str
    transport: Literal["tcp", "udp"] = "tcp"  # RTSP only
    reader: Reader = "auto"
    loop: bool = True  # files only
    pace: Literal["realtime", "fast"] = "realtime"  # files only
    stall_timeout_s: Annotated[float, Field(gt=0)] = 5.0
    open_timeout_s: Annotated[float, Field(gt=0)] = 10.0
    backoff: BackoffConfig = BackoffConfig()
    options: dict[str, str] = Field(default_factory=dict)  # extra FFmpeg/PyAV options
    decoder_threads: DecoderThreads = 0
    decoder: DecoderConfig = DecoderConfig()
    tls: SourceTlsConfig = SourceTlsConfig()  # https and rtsps only

    @field_validator("url")
    @classmethod
    def _a_source(cls, v: str) -> str:
        if not v.strip():
            raise ValueError("must not be empty")
        problem = _url_problem(v)
        if problem is not None:
            raise ValueError(problem)
        return v


class SourceTuning(Strict):
    """Every stream's source settings as `appliance tune` chose them (the config's
    `tuning.sources`: wins over each stream's own; None leaves it)."""

    reader: Reader | None = None
    decoder_threads: DecoderThreads | None = None


# A URL's scheme: what FFmpeg splits a URL on is the first ":", with "//" or without.
_URL_SCHEME = re.compile(r"^\s*([A-Za-z][A-Za-z0-9+.-]*):")
_URL_FORM = "scheme://[user:password@]host[:port]/path"


def _url_problem(url: str) -> str | None:
    """Why a source URL would be read otherwise than it looks, or None (a file's path
    too). The message shows the URL masked: it is refused before anything masks it.
    FFmpeg reads `rtsp:/u:pw@cam` and `rtsp:// u:pw@cam` as `rtsp://u:pw@cam`."""
    scheme = _URL_SCHEME.match(url)
    has_slashes = scheme is not None and url[scheme.end() :].startswith("//")
    if scheme is None or not (has_slashes or scheme[1].lower() in URL_KINDS):
        return None  # a file's path, or a /dev/videoN
    if scheme[1].lower() not in URL_KINDS:
        # Else read as a file name, and "file not found" would hide the real fault.
        return (
            f"unsupported URL scheme {scheme[1]!r} (supported: {', '.join(URL_KINDS)}; "
            "or a video file's path, or /dev/videoN)"
        )
    shown = repr(mask_one_url(url))
    odd = next((c for c in url if c.isspace() or not c.isprintable()), None)
    if odd is not None:
        return (
            f"{shown}: whitespace and control characters are not allowed in a URL "
            f"(found {odd!r} at position {url.index(odd)}); percent-encode them (%20)"
        )
    if not has_slashes:
        return f'malformed URL {shown}: "//" must follow the scheme ({_URL_FORM})'
    if not url_host(url):
        return f"malformed URL {shown}: no host ({_URL_FORM})"
    try:
        _ = urlsplit(url).port  # parsed when read
    except ValueError:
        return (
            f"malformed URL {shown}: the port is not a number from 0 to 65535 (a password's"
            ' "/", "?" or "#" must be percent-encoded)'
        )
    return None
