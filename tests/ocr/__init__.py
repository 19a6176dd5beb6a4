"""Shared parts of the OCR tests: frames with text drawn by OpenCV at known places, the
bundled PP-OCR models behind the real runtime (`load_model` + `ModelBatcher`), and a copy
of a model with its metadata rewritten (for the recogniser's compile-time checks).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import cv2
import numpy as np

from appliance.models import ModelBatcher, load_model
from pipelines.compiler import parse_workflow
from pipelines.spec import BatchingSpec, read_workflow_file
from pipelines.types import Image

ROOT = Path(__file__).resolve().parents[2]
MODELS = ROOT / "configs" / "models"
PHOTOS = ROOT / "configs" / "media" / "sources"
READ_TEXT = ROOT / "configs" / "workflows" / "read_text.yaml"
FRAME_SIZE = (960, 540)  # width, height
FONT = cv2.FONT_HERSHEY_SIMPLEX
# No wait for company: a frame's crops are queued together (submit_many), so they meet in
# one batch without any timing.
BATCHING = BatchingSpec(max_batch_size=8, max_queue_delay_ms=0)


@dataclass(frozen=True, slots=True)
class Line:
    """A line of text drawn on a frame, and the bounding box of its ink (xyxy px)."""

    text: str
    box: tuple[int, int, int, int]


def draw_line(
    image: Image, text: str, origin: tuple[int, int], scale: float, color: int, thickness: int
) -> Line:
    """cv2.putText (FONT_HERSHEY_SIMPLEX, anti-aliased) in grey level `color`; the box is
    where the ink went, measured by drawing the same text on a blank mask. OpenCV 5 draws
    this font as a sans-serif outline font: thickness 1 is regular, 2 and more bold."""
    cv2.putText(image, text, origin, FONT, scale, (color,) * 3, thickness, cv2.LINE_AA)
    mask = np.zeros(image.shape[:2], np.uint8)
    cv2.putText(mask, text, origin, FONT, scale, 255, thickness, cv2.LINE_AA)
    x, y, w, h = cv2.boundingRect(mask)
    return Line(text, (x, y, x + w, y + h))


def overlay_frame() -> tuple[Image, list[Line]]:
    """960x540 light grey: a dark caption, and a camera-style white time stamp on a dark
    banner across the bottom."""
    image = np.full((FRAME_SIZE[1], FRAME_SIZE[0], 3), 235, np.uint8)
    caption = draw_line(image, "CAMERA 07 PARKING", (60, 150), 1.6, 20, 3)
    cv2.rectangle(image, (0, 440), (FRAME_SIZE[0], FRAME_SIZE[1]), (30, 30, 30), -1)
    stamp = draw_line(image, "2026-11-29 14:30", (500, 500), 1.4, 255, 3)
    return image, [caption, stamp]


def grass_frame() -> tuple[Image, list[Line]]:
    """The grass photo tiled to 960x540, white text at the top, black at the bottom."""
    image = grass()
    caption = draw_line(image, "CAMERA 07 PARKING", (40, 90), 1.6, 255, 3)
    stamp = draw_line(image, "2026-11-29 14:30", (520, 480), 1.4, 0, 3)
    return image, [caption, stamp]


def grass() -> Image:
    """configs/media/sources/grass.png (512x512, grey) tiled and cut to 960x540."""
    tile = cv2.imread(str(PHOTOS / "grass.png"), cv2.IMREAD_COLOR)
    assert tile is not None
    return np.ascontiguousarray(np.tile(tile, (2, 2, 1))[: FRAME_SIZE[1], : FRAME_SIZE[0]])


def start_models(workflow: Path = READ_TEXT) -> dict[str, ModelBatcher]:
    """The models a workflow file declares, loaded as the runtime loads them (paths
    relative to the file), but on the CPU and with BATCHING; each batcher started."""
    spec = parse_workflow(read_workflow_file(workflow))
    models = {}
    for model_id, model in spec.models.items():
        cpu = model.model_copy(update={"providers": ["cpu"], "batching": BATCHING})
        loaded = load_model(model_id, cpu, lambda p: (workflow.parent / p).resolve())
        models[model_id] = ModelBatcher(loaded, cpu.batching)
    for batcher in models.values():  # once all loaded: a load error leaves no thread behind
        batcher.start()
    return models


def stop_models(models: Mapping[str, ModelBatcher]) -> None:
    for batcher in models.values():
        assert batcher.stop(5.0)


def with_metadata(source: Path, target: Path, metadata: Mapping[str, str]) -> Path:
    """A copy of an ONNX model whose metadata is exactly `metadata`. ModelProto's
    metadata_props (field 14 in onnx.proto) are top-level fields, so the copy drops
    those and appends new ones; everything else is kept byte for byte."""
    data = source.read_bytes()
    kept, pos = bytearray(), 0
    while pos < len(data):
        start = pos
        key, pos = _varint(data, pos)
        if key & 7 == 0:  # wire type 0: a varint value (ir_version, model_version)
            _, pos = _varint(data, pos)
        elif key & 7 == 2:  # wire type 2: length-delimited (strings, the graph, ...)
            length, pos = _varint(data, pos)
            pos += length
        else:
            raise ValueError(f"{source}: unexpected wire type {key & 7} at byte {start}")
        if key >> 3 != 14:
            kept += data[start:pos]
    for k, v in metadata.items():
        kept += _field(14, _field(1, k.encode()) + _field(2, v.encode()))
    target.write_bytes(bytes(kept))
    return target


def _varint(data: bytes, pos: int) -> tuple[int, int]:
    value, shift = 0, 0
    while True:
        byte = data[pos]
        value |= (byte & 0x7F) << shift
        pos, shift = pos + 1, shift + 7
        if byte < 0x80:
            return value, pos


def _field(number: int, payload: bytes) -> bytes:
    return _encode(number << 3 | 2) + _encode(len(payload)) + payload


def _encode(n: int) -> bytes:
    out = bytearray()
    while True:
        low, n = n & 0x7F, n >> 7
        out.append(low | (0x80 if n else 0))
        if not n:
            return bytes(out)
