"""Video sources: one module per concern (RTSP H.264/H.265 over our RTP reader, the rest
through FFmpeg), decoded with PyAV; see grabber.py for the thread."""

from appliance.sources.backoff import Backoff
from appliance.sources.base import (
    SourceError,
    StateCallback,
    StreamState,
    VideoSource,
    mask_url,
    source_kind,
)
from appliance.sources.grabber import Grabber, GrabberStats, slot_for
from appliance.sources.opener import open_source
from appliance.sources.slot import LatestFrame

__all__ = [
    "Backoff",
    "Grabber",
    "GrabberStats",
    "LatestFrame",
    "SourceError",
    "StateCallback",
    "StreamState",
    "VideoSource",
    "mask_url",
    "open_source",
    "slot_for",
    "source_kind",
]
