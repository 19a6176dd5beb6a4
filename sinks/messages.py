"""The messages sinks send, built once per result on the worker thread (small JSON
documents, no image). Their schemas are documented in docs/outputs.md; MQTT and webhooks
send the same documents."""

from __future__ import annotations

import json
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


def encode(message: dict[str, Any]) -> bytes:
    """Compact UTF-8 JSON: the bytes that are sent, and signed (webhooks)."""
    return json.dumps(message, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
