"""The messages sinks send, built once per result on the worker thread (small JSON
documents, no image). Their schemas are documented in docs/outputs.md; MQTT and webhooks
send the same documents."""

from __future__ import annotations

import json
import threading
from typing import Any

from pipelines.types import FrameResult

SCHEMA_VERSION = 1  # bumped when a field changes meaning or goes away


def prediction(result: FrameResult) -> dict[str, Any]:
    """`<prefix>/<stream>/predictions` and the webhook's `prediction` event: one result."""
    return {
        "v": SCHEMA_VERSION,
        "stream": result.stream_id,
        "seq": result.seq,
        "capture_time": round(result.capture_time, 6),  # epoch seconds at capture
        "latency_ms": round(result.age_seconds * 1000, 3),  # capture → result
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
    """Compact UTF-8 JSON: the bytes that are sent, and signed (webhooks)."""
    return json.dumps(message, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
