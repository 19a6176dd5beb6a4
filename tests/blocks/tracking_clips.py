"""Helpers for the tracking and counting tests: Detections per frame, real H.264 clips of
moving rectangles (PyAV, libx264), and a `contours` block that finds them again with cv2.

A clip is synthesised from known box paths, encoded, decoded and detected for real, so the
end-to-end tests compare the blocks' counts with the truth the paths define.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import av
import cv2
import numpy as np
import yaml

from pipelines.blocks.base import BlockType, BuildContext, StepFactory, stateless
from pipelines.compiler import compile_workflow
from pipelines.executor import WorkflowRun
from pipelines.registry import BlockRegistry
from pipelines.types import Detections, Frame, Image

Box = tuple[float, float, float, float]
BACKGROUND, FOREGROUND = 20, 255  # grey levels: dark scene, white objects
FPS = 25


def dets(*boxes: Box, conf: float | Sequence[float] = 0.9, ids: Sequence[int] = ()) -> Detections:
    """Detections of class 0 ("object") with the given xyxy boxes (tracks when `ids`)."""
    n = len(boxes)
    out = Detections.from_arrays(
        np.asarray(boxes, np.float32).reshape(n, 4),
        np.broadcast_to(np.asarray(conf, np.float32), (n,)),
        np.zeros(n),
        labels=("object",),
    )
    if ids:
        return Detections(
            out.xyxy, out.confidence, out.class_id, out.class_name, np.asarray(ids, np.int64)
        )
    return out


def frame(image: Image, seq: int = 0, stream: str = "cam") -> Frame:
    return Frame(stream, seq, seq / FPS, 0.0, 0.0, image)


def blank(width: int = 160, height: int = 120) -> Image:
    return np.full((height, width, 3), BACKGROUND, np.uint8)


def render(boxes: Sequence[Box], width: int = 160, height: int = 120) -> Image:
    """A dark frame with a white filled rectangle per box (integer pixel corners)."""
    img = blank(width, height)
    for x1, y1, x2, y2 in boxes:
        img[int(y1) : int(y2), int(x1) : int(x2)] = FOREGROUND
    return img


def write_h264(path: Path, images: Sequence[Image]) -> Path:
    """Encode BGR images as an H.264 MP4 (libx264, yuv420p, near-lossless crf)."""
    height, width = images[0].shape[:2]
    with av.open(str(path), "w") as out:
        stream: Any = out.add_stream("libx264", rate=FPS)
        stream.width, stream.height, stream.pix_fmt = width, height, "yuv420p"
        stream.options = {"preset": "ultrafast", "crf": "18"}
        for img in images:
            out.mux(stream.encode(av.VideoFrame.from_ndarray(img, format="bgr24")))
        out.mux(stream.encode(None))
    return path


def decode_h264(path: Path) -> Iterator[Image]:
    """Decoded BGR frames of a clip, checking it really is H.264."""
    with av.open(str(path)) as container:
        video = container.streams.video[0]
        assert video.codec_context.name == "h264"
        for f in container.decode(video):
            yield np.asarray(f.to_ndarray(format="bgr24"), np.uint8)


def contour_boxes(image: Image) -> Detections:
    """Real image processing: threshold the decoded frame, one box per outer contour."""
    grey = cv2.cvtColor(image, cv2.COLOR_BGR2GRAY)
    _, mask = cv2.threshold(grey, (BACKGROUND + FOREGROUND) // 2, 255, cv2.THRESH_BINARY)
    contours, _ = cv2.findContours(mask, cv2.RETR_EXTERNAL, cv2.CHAIN_APPROX_SIMPLE)
    rects = [cv2.boundingRect(c) for c in contours]
    boxes = [(x, y, x + w, y + h) for x, y, w, h in rects if w * h >= 16]  # px²: no specks
    return dets(*boxes, conf=0.9)


class ContoursBlock(BlockType):
    """image -> detections: `contour_boxes` as a block, for end-to-end workflows."""

    type_name = "contours"
    inputs = {"image": ("image", "frame")}
    outputs = {"detections": "detections"}

    @classmethod
    def build(cls, params: Any, ctx: BuildContext) -> StepFactory:
        return stateless(contour_boxes)


REGISTRY = BlockRegistry(
    {
        "contours": f"{__name__}:ContoursBlock",
        "track": "pipelines.blocks.track:TrackBlock",
        "line_counter": "pipelines.blocks.line_counter:LineCounterBlock",
        "zone_counter": "pipelines.blocks.zone_counter:ZoneCounterBlock",
        "filter": "pipelines.blocks.filter:FilterBlock",
    }
)


def instantiate(doc: dict[str, Any]) -> WorkflowRun:
    """Compile `doc` with the real compiler and this module's registry; one stream's run."""
    return compile_workflow(doc, BuildContext(models={}), REGISTRY).instantiate()


def run_clip(path: Path, doc: dict[str, Any], output: str) -> list[Any]:
    """`output` of the workflow for every decoded frame of the clip, in order."""
    run = instantiate(doc)
    return [run.run(frame(img, i)).outputs[output] for i, img in enumerate(decode_h264(path))]


def doc_example(block_type: str) -> dict[str, Any]:
    """The block's YAML example in docs/workflows.md (the first one after its
    `<!-- block: NAME -->` marker), its `detect` blocks (which need a model) replaced by
    `contours`, so the documented example can be compiled and run."""
    text = (Path(__file__).parents[2] / "docs" / "workflows.md").read_text()
    section = text.split(f"<!-- block: {block_type} -->\n", 1)[1]
    doc: dict[str, Any] = yaml.safe_load(section.split("```yaml\n", 1)[1].split("```", 1)[0])
    doc["blocks"] = [
        {"id": b["id"], "type": "contours"} if b["type"] == "detect" else b for b in doc["blocks"]
    ]
    return doc
