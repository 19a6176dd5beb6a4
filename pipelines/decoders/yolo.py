"""YOLO exports: Ultralytics YOLOv8/v11 and YOLOv5 raw heads (NMS done here).

Input: float32 or float16 (the model's own dtype) [N,3,H,W] RGB scaled to 0..1; the
frame is letterboxed (aspect kept, centred, grey 114 padding as Ultralytics trains) to
the input size: the config's, else the model's fixed one, else 640x640.

Output 0 is the head; its layout is read from the declared shape at compile time:
- v8/v11: [4+nc, A] (cx, cy, w, h, then nc class scores; no objectness), or [A, 4+nc];
- v5: [A, 5+nc] (cx, cy, w, h, objectness, nc class scores; score = obj * cls).
With nc known (from `labels`, which the runtime fills from Ultralytics' `names` metadata
when the config has none) the dim equal to 4+nc or 5+nc decides. Without it the smaller
dim is the channel dim, and a channel-first head reads as v8, a channel-last one as v5
(their export defaults): give labels to make any other case explicit. Each anchor keeps
its best class; NMS is class-aware (Ultralytics' default).

With the runtime's graph prologue (`info.prologue`) the channel swap, cast and scaling run
inside the session; `preprocess` hands over the letterboxed BGR uint8 image.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from pipelines.decoders.base import (
    DecodeOptions,
    ImageInput,
    Transform,
    bgr_sample,
    check_image_input,
    composed,
    describe,
    mismatch,
    resolve_size,
)
from pipelines.decoders.nms import nms
from pipelines.decoders.prologue import Prologue, PrologueDtype
from pipelines.decoders.resize import PAD_GREY, Letterbox, boxes_to_frame, planar_rgb
from pipelines.models import Dim, ModelInfo, Tensor
from pipelines.types import Detections, FloatArray, Image, IntArray

KIND = "yolo"
DEFAULT_SIZE = (640, 640)  # Ultralytics default imgsz
_PIXEL_SCALE = 1 / 255  # Ultralytics feeds RGB in 0..1


@dataclass(frozen=True, slots=True)
class HeadLayout:
    """How one sample's head output is laid out."""

    channels_first: bool  # [C, A] (v8 export default) rather than [A, C]
    objectness: bool  # YOLOv5: channel 4 is objectness, class scores follow
    num_classes: int


class YoloDecoder:
    """Decoder for raw YOLOv5/v8/v11 detection heads."""

    def __init__(self, info: ModelInfo, options: DecodeOptions) -> None:
        image = _image_input(info)
        self._labels = info.labels
        self.layout = head_layout(info, len(self._labels) or None)
        self.input_size = resolve_size(info, KIND, image) or DEFAULT_SIZE
        self._letterbox = Letterbox(self.input_size, pad_value=PAD_GREY, center=True)
        self._in_graph = composed(info, KIND, _prologue(image))
        self._dtype = image.dtype
        self._options = options

    @staticmethod
    def prologue(info: ModelInfo) -> Prologue:
        """RGB planes scaled to 0..1 in the model's dtype."""
        return _prologue(_image_input(info))

    def preprocess(self, image: Image) -> tuple[Tensor, Transform]:
        """BGR frame -> [3,H,W] RGB 0..1 in the model's dtype; with the graph prologue,
        the letterboxed BGR uint8 HxWx3 image."""
        boxed, transform = self._letterbox(image)
        if self._in_graph:
            return bgr_sample(boxed), transform
        return planar_rgb(boxed, self._dtype, _PIXEL_SCALE), transform

    def decode(self, outputs: Sequence[Tensor], transform: Transform) -> Detections:
        """Head output -> boxes with score >= confidence after class-aware NMS."""
        # float16 heads too: numpy has no native float16 maths, float32 is faster
        head = np.asarray(outputs[0], np.float32)
        table = head if self.layout.channels_first else head.T  # [C, A] view either way
        cxcywh, scores, class_ids = self._candidates(table)
        if len(scores) == 0:
            return Detections.empty()
        half = cxcywh[:, 2:] / 2
        xyxy = np.concatenate([cxcywh[:, :2] - half, cxcywh[:, :2] + half], axis=1)
        keep = nms(xyxy, scores, self._options.nms_iou, self._options.max_detections, class_ids)
        return Detections.from_arrays(
            boxes_to_frame(xyxy[keep], transform), scores[keep], class_ids[keep], self._labels
        )

    def _candidates(self, table: FloatArray) -> tuple[FloatArray, FloatArray, IntArray]:
        """Anchors scoring >= confidence: boxes (K,4), best-class scores, class ids."""
        conf = self._options.confidence
        if self.layout.objectness:
            # obj * cls <= obj, so the objectness alone filters almost all anchors cheaply
            cols = np.flatnonzero(table[4] >= conf)
            class_scores = table[5:, cols] * table[4, cols]
        else:
            cols = np.flatnonzero(table[4:].max(axis=0) >= conf)
            class_scores = table[4:, cols]
        class_ids = class_scores.argmax(axis=0)
        scores = class_scores[class_ids, np.arange(len(cols))]
        sure = scores >= conf  # v5 only: the product may fall below the threshold
        boxes = table[:4, cols[sure]].T.astype(np.float32)
        return boxes, scores[sure].astype(np.float32), class_ids[sure].astype(np.int64)


def _image_input(info: ModelInfo) -> ImageInput:
    return check_image_input(info, KIND, "NCHW", ("float32", "float16"))


def _prologue(image: ImageInput) -> Prologue:
    scale = float(np.float32(_PIXEL_SCALE))  # planar_rgb multiplies by this float32
    dtype: PrologueDtype = "float16" if image.dtype == np.float16 else "float32"
    return Prologue(dtype, "NCHW", reverse_channels=True, scale=(scale, scale, scale))


def head_layout(info: ModelInfo, num_classes: int | None) -> HeadLayout:
    """Read the head layout from output 0's declared shape, or raise DecoderError."""
    head = info.outputs[0] if info.outputs else None
    layout = None
    if head is not None and len(head.shape) == 3:
        first, second = head.shape[1], head.shape[2]
        if num_classes:
            layout = _layout_for_classes(first, second, num_classes)
        else:
            layout = _layout_by_size(first, second)
    if layout is None or layout.num_classes < 1:
        raise mismatch(info, KIND, _expected_head(num_classes), describe(info.outputs[:1]))
    return layout


def _expected_head(nc: int | None) -> str:
    if nc is None:
        return "output 0 [N,4+nc,A] or [N,A,4+nc] (v8/v11) or [N,A,5+nc] (v5) with fixed channels"
    return (
        f"output 0 [N,{4 + nc},A] or [N,A,{4 + nc}] (v8/v11) or [N,A,{5 + nc}] (v5) for {nc} labels"
    )


def _layout_for_classes(first: Dim, second: Dim, nc: int) -> HeadLayout | None:
    if first == 4 + nc:
        return HeadLayout(channels_first=True, objectness=False, num_classes=nc)
    if second == 4 + nc:
        return HeadLayout(channels_first=False, objectness=False, num_classes=nc)
    if second == 5 + nc:
        return HeadLayout(channels_first=False, objectness=True, num_classes=nc)
    if first == 5 + nc:
        return HeadLayout(channels_first=True, objectness=True, num_classes=nc)
    return None


def _layout_by_size(first: Dim, second: Dim) -> HeadLayout | None:
    """No class count: the smaller fixed dim holds the channels (a few vs thousands)."""
    if isinstance(first, int) and (not isinstance(second, int) or first <= second):
        return HeadLayout(channels_first=True, objectness=False, num_classes=first - 4)
    if isinstance(second, int):
        return HeadLayout(channels_first=False, objectness=True, num_classes=second - 5)
    return None
