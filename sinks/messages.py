"""The messages sinks send, built once per result on the worker thread (small JSON
documents, no image). Their schemas are documented in docs/outputs.md; MQTT and webhooks
send the same documents."""

from __future__ import annotations

import json
import threading
import time
from typing import Any

import cv2
import numpy as np
import orjson

from pipelines.types import FrameResult, iso_utc

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
        "workflow": result.version,  # which workflow version made it (a promotion switches)
        "outputs": result.predictions_json(),
    }


_last = threading.local()  # per worker thread: the last result's (stream, seq) and bytes


def encoded_prediction(result: FrameResult) -> bytes:
    """`encode(prediction(result))`, once per result however many sinks send it: every
    sink's `offer` runs on the stream's worker thread, one after the other."""
    key = (result.stream_id, result.seq)  # not the result: it holds a frame
    cached = getattr(_last, "entry", None)
    if cached is not None and cached[0] == key:
        hit: bytes = cached[1]
        return hit
    data = encode(prediction(result))
    _last.entry = (key, data)
    return data


def encode(message: dict[str, Any]) -> bytes:
    """Compact UTF-8 JSON: the bytes that are sent, and signed (webhooks). orjson encodes
    in C, on the stream's worker thread, once per result. What it refuses (a lone
    surrogate, which an MQTT request's id may hold and which has no UTF-8; an integer past
    64 bits) goes out through the standard library as ASCII JSON, `\\ud800` escaped,
    still valid JSON."""
    try:
        return orjson.dumps(message)
    except orjson.JSONEncodeError:
        return json.dumps(message, separators=(",", ":")).encode("ascii")


def encode_jpeg(image: np.ndarray, quality: int) -> bytes:
    """BGR uint8 H x W x 3 -> JPEG bytes at `quality` (OpenCV's 0-100 scale): MQTT
    snapshots, and the API's snapshot.jpg, MJPEG and `video: true` answers."""
    ok, jpeg = cv2.imencode(".jpg", image, [cv2.IMWRITE_JPEG_QUALITY, quality])
    if not ok:  # a BGR uint8 frame always encodes; anything else is a bug upstream
        raise ValueError(f"cannot encode a {image.shape} {image.dtype} image as JPEG")
    return bytes(jpeg)
