"""Which reader opens a configured source: ours for RTSP H.264/H.265, FFmpeg's for the rest."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable
from pathlib import Path

from appliance.policy.hosts import ANY_HOST, SourceHosts
from appliance.sources.base import SourceError, VideoSource, mask_url, source_kind
from appliance.sources.config import SourceConfig
from appliance.sources.pyav import open_pyav
from appliance.sources.rtp import UnsupportedCodecError, open_rtp
from appliance.sources.tls import camera_tls


def open_source(
    cfg: SourceConfig,
    resolve_path: Callable[[str], Path],
    *,
    stop: threading.Event | None = None,
    hosts: SourceHosts = ANY_HOST,
) -> VideoSource:
    """Open the source a config names; raises SourceError naming the (masked) URL or path.

    A host `hosts` (server.allowed_source_hosts) does not allow, its name looked up again
    now, is refused before anything connects: every reader, and the HTTP probe, start here.

    RTSP cameras go to the RTP reader (rtp.py) unless `reader: ffmpeg` or FFmpeg
    `options` are configured, or their video is neither H.264 nor H.265. Blocks up to
    `cfg.open_timeout_s` (twice, at worst, when an unsupported codec is found first).
    `stop` lets another thread end `frames()`. An https or rtsps camera's certificate is
    checked by every reader (`source.tls`, appliance/sources/tls.py).
    """
    refusal = hosts.connect_refusal(cfg.url)
    if refusal is not None:
        raise SourceError(f"{mask_url(cfg.url)}: {refusal}")
    if source_kind(cfg.url) == "rtsp" and cfg.reader == "auto" and not cfg.options:
        with contextlib.suppress(UnsupportedCodecError):
            return open_rtp(cfg, camera_tls(cfg, resolve_path), stop=stop)
    return open_pyav(cfg, resolve_path, stop=stop)
