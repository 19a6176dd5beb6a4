"""HTTP sources: tell an MJPEG camera (multipart JPEGs) from HLS and other HTTP video.

FFmpeg needs the "mpjpeg" demuxer named for MJPEG-over-HTTP cameras; HLS playlists and
plain video files over HTTP are probed by av.open itself.

The probe sends the camera's credentials to the camera's origin only (scheme, host and
port, RFC 6454): a redirect elsewhere, or from https to plain http, is followed without
them, as FFmpeg does (urllib's own handler would copy the Authorization header to any
host). An https camera's certificate is checked with the stream's `source.tls` context.
"""

from __future__ import annotations

import base64
import http.client
import logging
import ssl
import urllib.parse
import urllib.request
from typing import IO

from appliance.sources.base import mask_url
from appliance.sources.reach import endpoint, origin

log = logging.getLogger(__name__)

MJPEG_FORMAT = "mpjpeg"
_MJPEG_CONTENT_TYPE = "multipart/x-mixed-replace"
# Paths of common MJPEG cameras and servers: /video.mjpg, /mjpg/video.mjpg (Axis),
# /?action=stream (mjpg-streamer).
_MJPEG_HINTS = (".mjpg", ".mjpeg", "/mjpg/", "/mjpeg", "action=stream")
_VIDEO_SUFFIXES = (".m3u8", ".mp4", ".mkv", ".ts", ".webm", ".mov", ".flv")


def http_format(url: str, timeout_s: float, tls: ssl.SSLContext | None = None) -> str | None:
    """The FFmpeg demuxer to force for an http(s) URL, or None to let FFmpeg probe.

    The URL decides when it clearly names MJPEG or a video file; otherwise the
    response's Content-Type does (one request, headers only). `tls` checks an https
    camera's certificate (None: the system's store, as urllib's default).
    """
    parts = urllib.parse.urlsplit(url)
    if any(hint in f"{parts.path}?{parts.query}".lower() for hint in _MJPEG_HINTS):
        return MJPEG_FORMAT
    if parts.path.lower().endswith(_VIDEO_SUFFIXES):
        return None
    content_type = _content_type(url, timeout_s, tls)
    return MJPEG_FORMAT if content_type.startswith(_MJPEG_CONTENT_TYPE) else None


class _SameOriginCredentials(urllib.request.HTTPRedirectHandler):
    """Follows redirects, the Authorization header only within the request's origin."""

    def redirect_request(
        self,
        req: urllib.request.Request,
        fp: IO[bytes],
        code: int,
        msg: str,
        headers: http.client.HTTPMessage,
        newurl: str,
    ) -> urllib.request.Request | None:
        new = super().redirect_request(req, fp, code, msg, headers, newurl)
        if new is None or not new.has_header(_AUTHORIZATION):
            return new
        if origin(new.full_url) != origin(req.full_url):
            new.remove_header(_AUTHORIZATION)
            scheme = urllib.parse.urlsplit(newurl).scheme
            log.debug(
                "content type probe of %s: redirected to another origin (%s://%s): "
                "followed without the camera's credentials",
                mask_url(req.full_url),
                scheme,
                endpoint(newurl),
            )
        return new


_AUTHORIZATION = "Authorization"  # as urllib.request.Request stores it (str.capitalize)


def _content_type(url: str, timeout_s: float, tls: ssl.SSLContext | None) -> str:
    """The response's Content-Type, lower case; "" when the request fails."""
    opener = urllib.request.build_opener(
        urllib.request.HTTPSHandler(context=tls), _SameOriginCredentials()
    )
    try:
        with opener.open(_request(url), timeout=timeout_s) as response:
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
    return urllib.request.Request(bare, headers={_AUTHORIZATION: f"Basic {token}"})
