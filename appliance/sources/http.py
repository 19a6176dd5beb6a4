"""HTTP sources: tell an MJPEG camera (multipart JPEGs) from HLS and other HTTP video.

FFmpeg needs the "mpjpeg" demuxer named for MJPEG-over-HTTP cameras; HLS playlists and
plain video files over HTTP are probed by av.open itself.
"""

from __future__ import annotations

import base64
import http.client
import logging
import urllib.parse
import urllib.request

from appliance.sources.base import mask_url

log = logging.getLogger(__name__)

MJPEG_FORMAT = "mpjpeg"
_MJPEG_CONTENT_TYPE = "multipart/x-mixed-replace"
# Paths of common MJPEG cameras and servers: /video.mjpg, /mjpg/video.mjpg (Axis),
# /?action=stream (mjpg-streamer).
_MJPEG_HINTS = (".mjpg", ".mjpeg", "/mjpg/", "/mjpeg", "action=stream")
_VIDEO_SUFFIXES = (".m3u8", ".mp4", ".mkv", ".ts", ".webm", ".mov", ".flv")


def http_format(url: str, timeout_s: float) -> str | None:
    """The FFmpeg demuxer to force for an http(s) URL, or None to let FFmpeg probe.

    The URL decides when it clearly names MJPEG or a video file; otherwise the
    response's Content-Type does (one request, headers only).
    """
    parts = urllib.parse.urlsplit(url)
    if any(hint in f"{parts.path}?{parts.query}".lower() for hint in _MJPEG_HINTS):
        return MJPEG_FORMAT
    if parts.path.lower().endswith(_VIDEO_SUFFIXES):
        return None
    content_type = _content_type(url, timeout_s)
    return MJPEG_FORMAT if content_type.startswith(_MJPEG_CONTENT_TYPE) else None


def _content_type(url: str, timeout_s: float) -> str:
    """The response's Content-Type, lower case; "" when the request fails."""
    try:
        with urllib.request.urlopen(_request(url), timeout=timeout_s) as response:
            return str(response.headers.get("Content-Type", "")).lower()
    except (OSError, ValueError, http.client.HTTPException) as exc:  # av.open will report it
        log.debug("content type probe of %s failed: %s", mask_url(url), mask_url(str(exc)))
        return ""


def _request(url: str) -> urllib.request.Request:
    """A GET request; urllib does not take user:pass in the URL, so move it to a header."""
    parts = urllib.parse.urlsplit(url)
    if parts.username is None:
        return urllib.request.Request(url)
    host = parts.hostname or ""
    netloc = f"[{host}]" if ":" in host else host  # IPv6 literal
    if parts.port is not None:
        netloc = f"{netloc}:{parts.port}"
    bare = parts._replace(netloc=netloc).geturl()
    user = urllib.parse.unquote(parts.username)
    password = urllib.parse.unquote(parts.password or "")
    token = base64.b64encode(f"{user}:{password}".encode()).decode("ascii")
    return urllib.request.Request(bare, headers={"Authorization": f"Basic {token}"})
