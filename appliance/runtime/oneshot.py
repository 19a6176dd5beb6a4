"""One image through a workflow, synchronously: the appliance as a microservice.

The workflow comes from the runtime's compile cache, so repeated calls pay no compile; a
fresh instance per request keeps requests from sharing tracker or counter state. Model
samples go through the same batchers as the streams, so they batch with live traffic.
"""

from __future__ import annotations

import base64
import io
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import PIL.Image

from appliance.errors import LimitError
from appliance.policy.files import FilePolicy
from appliance.policy.limits import LimitsConfig
from appliance.profiling.hooks import StreamTrace
from appliance.profiling.tracer import Tracer
from appliance.runtime.runtime import Runtime
from pipelines.executor import CompiledWorkflow
from pipelines.types import Frame, FrameResult
from sinks.messages import encode_jpeg

DEFAULT_MAX_PIXELS = LimitsConfig().max_image_pixels
REQUEST_STREAM = "request"  # the stream id model batches record for these samples


class ImageDecodeError(ValueError):
    """The bytes are not an image OpenCV can decode."""


def decode_image(data: bytes, max_pixels: int = DEFAULT_MAX_PIXELS) -> np.ndarray:
    """JPEG/PNG/... bytes -> BGR uint8 H x W x 3. The size is read from the header first:
    LimitError (413, limits.max_image_pixels) before anything large is decoded."""
    if not data:
        raise ImageDecodeError("empty image")
    check_image_size(data, max_pixels)
    image = cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_COLOR)
    if image is None:
        raise ImageDecodeError(f"not a decodable image ({len(data)} bytes)")
    return image


def check_image_size(data: bytes, max_pixels: int) -> None:
    """LimitError past `max_pixels`, from the image's header: Pillow reads no pixel data
    for it. ImageDecodeError when the header is not an image's."""
    try:
        with PIL.Image.open(io.BytesIO(data)) as header:
            width, height = header.size
    except PIL.Image.DecompressionBombError:
        # Pillow's own guard, at twice its MAX_IMAGE_PIXELS (~179 MP): over ours too.
        width, height = 2 * (PIL.Image.MAX_IMAGE_PIXELS or 0) + 1, 1
    except PIL.UnidentifiedImageError:
        raise ImageDecodeError(f"not an image in a known format ({len(data)} bytes)") from None
    except (OSError, ValueError, SyntaxError) as exc:
        # SyntaxError: Pillow's plugins raise it for malformed headers.
        raise ImageDecodeError(f"not a decodable image ({len(data)} bytes): {exc}") from None
    if width * height > max_pixels:
        size = f"{width}x{height} is {width * height}" if height > 1 else f"over {width - 1}"
        raise LimitError("limits.max_image_pixels", max_pixels, f"image: {size} pixels", status=413)


@dataclass(frozen=True, slots=True)
class RunOptions:
    """What a run answers besides the outputs: a Chrome trace, the `video` output."""

    profile: bool = False
    video: bool = False


def run_image(
    runtime: Runtime,
    image: np.ndarray,
    workflow: Path | Mapping[str, Any],
    options: RunOptions = RunOptions(),
    files: FilePolicy | None = None,
) -> dict[str, Any]:
    """Run `workflow` once on `image`; its file paths go through `files` (the request
    policy for API calls). Its models are leased for the call only."""
    compiled = runtime.compile_workflow(workflow, "workflow", files)
    try:
        frame = Frame(REQUEST_STREAM, 0, None, time.time(), time.perf_counter(), image)
        result = compiled.instantiate().run(frame)
    finally:
        runtime.release_workflow(compiled)
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
    if options.profile:
        answer["trace"] = chrome_trace(result, compiled)
    if options.video and result.image is not None:  # drawn: the run asked for video
        # The annotated or blurred frame, as the stream's snapshot would be.
        answer["video"] = base64.b64encode(encode_jpeg(result.image, 90)).decode("ascii")
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
