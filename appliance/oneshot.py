"""One image through a workflow, synchronously: the appliance as a microservice.

The workflow comes from the runtime's compile cache, so repeated calls pay no compile; a
fresh instance per request keeps requests from sharing tracker or counter state. Model
samples go through the same batchers as the streams, so they batch with live traffic.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import cv2
import numpy as np

from appliance.profiling.hooks import StreamTrace
from appliance.profiling.tracer import Tracer
from appliance.runtime import Runtime
from pipelines.executor import CompiledWorkflow
from pipelines.types import Frame, FrameResult

REQUEST_STREAM = "request"  # the stream id model batches record for these samples


class ImageDecodeError(ValueError):
    """The bytes are not an image OpenCV can decode."""


def decode_image(data: bytes) -> np.ndarray:
    """JPEG/PNG/... bytes -> BGR uint8 H x W x 3."""
    if not data:
        raise ImageDecodeError("empty image")
    image = cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_COLOR)
    if image is None:
        raise ImageDecodeError(f"not a decodable image ({len(data)} bytes)")
    return image


def run_image(
    runtime: Runtime, image: np.ndarray, workflow: Path | Mapping[str, Any], profile: bool
) -> dict[str, Any]:
    compiled = runtime.compile_workflow(workflow, "workflow")
    frame = Frame(REQUEST_STREAM, 0, None, time.time(), time.perf_counter(), image)
    result = compiled.instantiate().run(frame)
    blocks = {
        bid: round((span[1] - span[0]) * 1000, 3)
        for bid, span in zip(compiled.block_ids, result.block_spans, strict=True)
        if span is not None
    }
    answer: dict[str, Any] = {
        "workflow": compiled.name,
        "outputs": result.predictions_json(),
        "image_size": [frame.width, frame.height],
        "timings_ms": {
            "total": round((result.done_mono - result.start_mono) * 1000, 3),
            "blocks": blocks,
        },
    }
    if profile:
        answer["trace"] = chrome_trace(result, compiled)
    return answer


def chrome_trace(result: FrameResult, workflow: CompiledWorkflow) -> dict[str, Any]:
    """The run as a Chrome trace, in the same conventions as the rolling traces (a
    `workflow.run` span with its blocks inside), from a tracer of its own."""
    tracer = Tracer()
    StreamTrace(tracer, result.stream_id, workflow)(result)
    return {
        "traceEvents": tracer.drain(),
        "displayTimeUnit": "ms",
        "otherData": {"source": "workflows/run"},
    }
