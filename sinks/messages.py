"""The messages sinks send (small JSON documents, no image). A result's prediction is
taken on the worker thread and encoded on the sinks' loop, once for every sink
(`pending_prediction`). Their schemas are documented in docs/outputs.md; MQTT and
webhooks send the same documents."""

from __future__ import annotations

import json
import threading
import time
from typing import Any

import cv2
import numpy as np

from pipelines.types import FrameResult, Image, iso_utc

SCHEMA_VERSION = 1  # bumped when a field changes meaning or goes away


def header(result: FrameResult) -> dict[str, Any]:
    """What every result and event document starts with: which frame, captured when."""
    return {
        "v": SCHEMA_VERSION,
        "stream": result.stream_id,
        "seq": result.seq,
        "capture_time": round(result.capture_time, 6),  # epoch seconds, for programs
        "captured_at": iso_utc(result.capture_time),  # the same, for people
    }


def notice(stream_id: str | None, event: dict[str, Any]) -> dict[str, Any]:
    """An event not made by a frame (the regression watch's): which stream (None: the
    appliance as a whole) and when, then the event itself."""
    now = time.time()
    return {
        "v": SCHEMA_VERSION,
        "stream": stream_id,
        "time": round(now, 3),
        "at": iso_utc(now),
        **event,
    }


def prediction(result: FrameResult) -> dict[str, Any]:
    """`<prefix>/<stream>/predictions` and the webhook's `prediction` event: one result."""
    return {
        **header(result),
        "latency_ms": round(result.age_seconds * 1000, 3),  # capture → result
        "outputs": result.predictions_json(),
    }


# A pending prediction's size, counted against a queue's byte bound before it is encoded:
# the header, and a row per detection (a row encodes to 80-100 bytes; over, not under).
PENDING_BASE_BYTES = 256
PENDING_ROW_BYTES = 128
_NO_IMAGE: Image = np.zeros((0, 0, 3), np.uint8)


class PendingPrediction:
    """`encode(prediction(result))`, built on the stream's worker thread in microseconds
    and encoded on first use, by the first sink that sends it: on the sinks' event loop,
    while the worker is already on its next frame. Every sink offered the same result
    shares one (`pending_prediction`), so it is encoded once however many send it.

    It keeps the result's outputs, which are immutable (Detections, counts made afresh
    each frame), but not its image: a queue of frames would hold gigabytes."""

    __slots__ = ("_data", "_result", "size")

    def __init__(self, result: FrameResult) -> None:
        outputs = {k: v for k, v in result.outputs.items() if not isinstance(v, np.ndarray)}
        self._result: FrameResult | None = FrameResult(
            result.stream_id,
            result.seq,
            result.pts,
            result.capture_time,
            result.capture_mono,
            result.start_mono,
            result.done_mono,
            _NO_IMAGE,
            outputs,
        )
        self._data: bytes | None = None
        rows = sum(len(v) for v in outputs.values() if hasattr(v, "to_json"))
        self.size = PENDING_BASE_BYTES + PENDING_ROW_BYTES * rows  # what a queue counts

    @property
    def data(self) -> bytes:
        """The encoded document (encoded now if no sink has asked yet). Two loops asking
        at once would both encode it, to the same bytes: no lock needed."""
        result = self._result  # read first: it is cleared only once `_data` is set
        data = self._data
        if data is None:
            assert result is not None
            data = self._data = encode(prediction(result))
            self._result = None  # the bytes are all that is needed from here on
        return data


Payload = bytes | PendingPrediction


def payload_bytes(payload: Payload) -> bytes:
    """The bytes to send: `payload` itself, or the pending prediction encoded."""
    return payload if isinstance(payload, bytes) else payload.data


def payload_size(payload: Payload) -> int:
    """What `payload` counts against a queue's byte bound."""
    return len(payload) if isinstance(payload, bytes) else payload.size


_last = threading.local()  # per worker thread: the last result's (stream, seq) and message


def pending_prediction(result: FrameResult) -> PendingPrediction:
    """The one PendingPrediction of `result` however many sinks send it: every sink's
    `offer` runs on the stream's worker thread, one after the other."""
    key = (result.stream_id, result.seq)  # not the result: it holds a frame
    cached = getattr(_last, "entry", None)
    if cached is not None and cached[0] == key:
        hit: PendingPrediction = cached[1]
        return hit
    pending = PendingPrediction(result)
    _last.entry = (key, pending)
    return pending


def encode(message: dict[str, Any]) -> bytes:
    """Compact UTF-8 JSON: the bytes that are sent, and signed (webhooks). A lone
    surrogate (an MQTT request's id may hold one) has no UTF-8: such a message goes out
    as ASCII JSON, `\\ud800` escaped, still valid JSON."""
    try:
        return json.dumps(message, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        return json.dumps(message, separators=(",", ":")).encode("ascii")


def encode_jpeg(image: np.ndarray, quality: int) -> bytes:
    """BGR uint8 H x W x 3 -> JPEG bytes at `quality` (OpenCV's 0-100 scale): MQTT
    snapshots, and the API's snapshot.jpg, MJPEG and `video: true` answers."""
    ok, jpeg = cv2.imencode(".jpg", image, [cv2.IMWRITE_JPEG_QUALITY, quality])
    if not ok:  # a BGR uint8 frame always encodes; anything else is a bug upstream
        raise ValueError(f"cannot encode a {image.shape} {image.dtype} image as JPEG")
    return bytes(jpeg)
