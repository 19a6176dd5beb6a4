"""`annotate`: draw boxes, labels, track ids, counts, OCR text, lines and zones on a copy.

```yaml
- id: annotated
  type: annotate
  image: frame                # optional; e.g. a blur block's output
  detections: tracked         # optional: detections or tracks
  counts: door                # optional: a counter's counts, drawn top-left
  text: plates_text           # optional: an ocr block's texts
  labels: [class, confidence, track]
  color_by: track             # track (the track id when tracked, else class) | class
  thickness: 2                # px
  font_scale: 0.5
  lines:
    - {name: door, points: [[0.1, 0.6], [0.9, 0.6]]}
  zones:
    - {name: till, points: [[100, 80], [400, 80], [400, 300], [100, 300]]}
```

The input image is never written to: one copy per frame is drawn on with OpenCV. A line's
name sits above its first point; a zone's inside the top-left corner of its bounding box.
Either is kept inside the frame, and moved below the counts box where it would overlap it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Annotated, Any, Literal

import cv2
import numpy as np
from pydantic import Field

from pipelines.blocks._draw import (
    PALETTE,
    WHITE,
    fit_label,
    label,
    label_size,
    palette_index,
    text_lines,
    text_lines_rect,
)
from pipelines.blocks.base import (
    OPTIONAL,
    BlockParams,
    BlockType,
    BuildContext,
    StepFactory,
    StepFn,
)
from pipelines.geometry import PointList, Points, Polygon, Units
from pipelines.types import Detections, Image, Texts

LabelPart = Literal["class", "confidence", "track"]
TextsFn = Callable[[Detections], list[str]]
COUNTS_ORIGIN = (8, 8)  # px from the top-left corner


class LineShape(BlockParams):
    name: str = ""
    points: PointList


class ZoneShape(BlockParams):
    name: str = ""
    points: Polygon


class AnnotateParams(BlockParams):
    labels: list[LabelPart] = ["class", "confidence", "track"]  # [] draws boxes only
    color_by: Literal["track", "class"] = "track"  # track falls back to class untracked
    thickness: Annotated[int, Field(ge=1, le=50)] = 2  # px
    font_scale: Annotated[float, Field(gt=0.0, le=10.0)] = 0.5  # OpenCV Hershey scale
    lines: list[LineShape] = []
    zones: list[ZoneShape] = []
    units: Units = "auto"  # of lines and zones: px, norm (0-1), or auto-detected


class AnnotateBlock(BlockType):
    type_name = "annotate"
    description = "Draw detections, tracks, counts, OCR text, lines and zones on a copy."
    Params = AnnotateParams
    draws = True
    inputs = {
        "image": ("image", "frame"),
        "detections": ("detections", OPTIONAL),
        "counts": ("counts", OPTIONAL),
        "text": ("text", OPTIONAL),
    }
    outputs = {"image": "image"}

    @classmethod
    def build(cls, params: Any, ctx: BuildContext) -> StepFactory:
        p: AnnotateParams = params
        draw_boxes = _box_drawer(p)
        thick, scale = p.thickness, p.font_scale

        def factory() -> StepFn:
            shapes = _Shapes(p)  # per stream: pixel coordinates cached per frame size

            def annotate(
                image: Image, detections: Detections | None, counts: Any, text: Texts | None
            ) -> Image:
                out = image.copy()
                lines = [] if counts is None else _count_lines(counts)
                shapes.draw(out, lines)
                if detections is not None and len(detections):
                    draw_boxes(out, detections)
                if text is not None and len(text):
                    _ocr(out, text, thick, scale)
                text_lines(out, lines, COUNTS_ORIGIN, scale)
                return out

            return annotate

        return factory


def _box_drawer(p: AnnotateParams) -> Callable[[Image, Detections], None]:
    """Boxes in palette colours (by track id when tracked, unless color_by: class), each
    with its label on a filled tab sitting on the box's top edge."""
    texts_of = _label_texts(p.labels)
    by_class, thick, scale = p.color_by == "class", p.thickness, p.font_scale

    def draw_boxes(out: Image, dets: Detections) -> None:
        ids = dets.class_id if by_class or dets.tracker_id is None else dets.tracker_id
        xyxy = np.round(dets.xyxy).astype(np.int32).tolist()
        for (x1, y1, x2, y2), slot, text in zip(
            xyxy, palette_index(ids), texts_of(dets), strict=True
        ):
            color = PALETTE[slot]
            cv2.rectangle(out, (x1, y1), (x2, y2), color, thick)
            if text:
                label(out, text, (x1 - thick // 2, y1 - thick // 2), color, scale)

    return draw_boxes


def _label_texts(parts: list[LabelPart]) -> TextsFn:
    """The function that writes each box's label (`person 0.87 #12`), fixed at build."""
    show_class, show_conf, show_track = ("class" in parts, "confidence" in parts, "track" in parts)

    def texts(dets: Detections) -> list[str]:
        columns: list[Iterable[str]] = []
        if show_class:
            columns.append(dets.class_name or map(str, dets.class_id.tolist()))
        if show_conf:
            columns.append(f"{c:.2f}" for c in dets.confidence.tolist())
        if show_track and dets.tracker_id is not None:
            columns.append(f"#{t}" for t in dets.tracker_id.tolist())
        return (
            [" ".join(row) for row in zip(*columns, strict=True)] if columns else [""] * len(dets)
        )

    return texts


def _ocr(out: Image, texts: Texts, thickness: int, scale: float) -> None:
    """OCR regions in white, each with its text on a white label above it."""
    xyxy = np.round(texts.detections.xyxy).astype(np.int32).tolist()
    for (x1, y1, x2, y2), text in zip(xyxy, texts.text, strict=True):
        cv2.rectangle(out, (x1, y1), (x2, y2), WHITE, thickness)
        if text:
            label(out, text, (x1, y1 - thickness // 2), WHITE, scale)


def _count_lines(counts: Any) -> list[str]:
    """`{"door": {"in": 3, "out": 1}, "total": 4}` -> ["door: in 3, out 1", "total: 4"]."""
    if not isinstance(counts, Mapping):
        return [str(counts)]
    return [
        f"{key}: " + ", ".join(f"{k} {v}" for k, v in value.items())
        if isinstance(value, Mapping)
        else f"{key}: {value}"
        for key, value in counts.items()
    ]


class _Shapes:
    """Configured lines and zones of one stream, as int32 polylines for the current
    frame size (recomputed only when the size changes), each with its name: a line's
    above its first point, a zone's inside its bounding box's top-left corner (a zone's
    first point may be anywhere on it; its top is where a reader looks for a name)."""

    def __init__(self, p: AnnotateParams) -> None:
        shapes = [(s.name, s.points, False) for s in p.lines]
        shapes += [(s.name, s.points, True) for s in p.zones]
        # Palette slots from the end, so shapes rarely share a colour with class 0, 1, ...
        self._shapes = [
            (name, Points(points, p.units), closed, PALETTE[-1 - i % len(PALETTE)])
            for i, (name, points, closed) in enumerate(shapes)
        ]
        self._thick, self._scale = p.thickness, p.font_scale
        self._label_sizes = [label_size(name, self._scale) for name, *_ in self._shapes]
        self._named = any(name for name, *_ in self._shapes)
        self._size = (-1, -1)
        self._pixels: list[tuple[np.ndarray[Any, np.dtype[np.int32]], tuple[int, int]]] = []

    def draw(self, out: Image, counts: list[str]) -> None:
        """Draw every shape and its name, no name overlapping the box of the `counts`
        lines (measured only when a shape has a name to place)."""
        if not self._shapes:
            return
        size = (out.shape[1], out.shape[0])
        if size != self._size:
            self._resize(size)
        avoid = text_lines_rect(counts, COUNTS_ORIGIN, self._scale) if self._named else None
        for (name, _, closed, color), (pts, top_left), label_wh in zip(
            self._shapes, self._pixels, self._label_sizes, strict=True
        ):
            cv2.polylines(out, [pts], closed, color, self._thick, cv2.LINE_AA)
            if name:
                label(out, name, fit_label(top_left, label_wh, size, avoid), color, self._scale)

    def _resize(self, size: tuple[int, int]) -> None:
        """Pixel polylines, and where each name's top-left corner wants to be, for a
        frame size."""
        self._pixels = []
        for (_, points, closed, _), (_, label_h) in zip(
            self._shapes, self._label_sizes, strict=True
        ):
            pts = np.round(points.pixels(*size)).astype(np.int32)
            if closed:  # just inside the outline, clear of its stroke
                at = int(pts[:, 0].min()) + self._thick, int(pts[:, 1].min()) + self._thick
            else:
                at = int(pts[0, 0]), int(pts[0, 1]) - label_h
            self._pixels.append((pts, at))
        self._size = size
