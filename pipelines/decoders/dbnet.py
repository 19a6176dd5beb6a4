"""DBNet text detection (PaddleOCR PP-OCR det, e.g. configs/models/ppocr_v4_det.onnx).

Input: float32 [N,3,H,W], H and W multiples of 32, channels in the frame's own BGR order
with ImageNet mean/std applied in that order: PaddleOCR reads frames with cv2.imread and
never swaps channels (`NormalizeImage` in ppocr/data/imaug/operators.py); RapidOCR does the
same. Feeding RGB instead changed nothing measurable on our test frames, so we keep the
reference order. Like PaddleOCR's `DetResizeForTest` (limit_type "max"), a frame whose long
side exceeds 960 px is scaled down to it, then each side is rounded to a multiple of 32 by a
slight stretch (960x540 -> 960x544); a configured `input_size` (multiples of 32) is used
as is, stretched. Either way one frame size gives one sample shape, so frames of one
stream batch together.

Output: a text probability map [N,1,H,W]. Decoding follows PaddleOCR's `DBPostProcess`
(ppocr/postprocess/db_postprocess.py, score_mode "fast"): pixels > 0.3 -> binary map ->
contours -> minimum-area rectangle per contour, scored by the mean probability inside it
(kept when >= confidence, PaddleOCR's box_thresh is 0.6), then expanded ("unclipped") by
distance = area * 1.5 / perimeter. PaddleOCR offsets the contour polygon with pyclipper;
we offset the rectangle itself, (w, h) -> (w + 2d, h + 2d), which for a rectangle equals
the minimum-area box of pyclipper's round-joined result, with no extra dependency. The
result is the axis-aligned bounding box of that rotated rectangle, in frame pixels, class
"text" (or the model's first label). The regions do not overlap, so there is no NMS and
`nms_iou` is unused; `max_detections` keeps the best-scored boxes.

With the runtime's graph prologue (`info.prologue`) the cast and the normalisation, the
same float32 multiply-add as below, run inside the session; `preprocess` hands over the
resized BGR uint8 image.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

import cv2
import numpy as np

from pipelines.decoders.base import (
    DecodeOptions,
    Transform,
    bgr_sample,
    composed,
    convolutional_size,
    describe,
    dim_is,
    mismatch,
)
from pipelines.decoders.prologue import Prologue
from pipelines.decoders.resize import Resize, boxes_to_frame
from pipelines.models import ModelInfo, Tensor
from pipelines.types import Detections, FloatArray, Image

KIND = "dbnet"
LIMIT_SIDE = 960  # px: longest input side (PaddleOCR det_limit_side_len, limit_type "max")
SIZE_MULTIPLE = 32  # the backbone downsamples 32x
BINARY_THRESHOLD = 0.3  # probability above which a pixel is text (det_db_thresh)
UNCLIP_RATIO = 1.5  # det_db_unclip_ratio: DBNet trains on regions shrunk by 0.4
MIN_SIDE = 3.0  # px at model input: shorter box sides are noise (DBPostProcess min_size)
MAX_CANDIDATES = 1000  # contours looked at per frame (DBPostProcess max_candidates)
# ImageNet statistics in 0..1 units, applied to B, G, R in that order (see above).
_MEAN = np.array([0.485, 0.456, 0.406], np.float32)
_STD = np.array([0.229, 0.224, 0.225], np.float32)
# (x / 255 - mean) / std == x * _SCALE + _SHIFT, per channel, shaped for (3, H, W) planes.
_SCALE = (1.0 / (255.0 * _STD)).reshape(3, 1, 1)
_SHIFT = (-_MEAN / _STD).reshape(3, 1, 1)
# The same normalisation in the graph (float32 values, exact as Python floats).
PROLOGUE = Prologue(
    "float32",
    "NCHW",
    scale=(float(_SCALE[0, 0, 0]), float(_SCALE[1, 0, 0]), float(_SCALE[2, 0, 0])),
    offset=(float(_SHIFT[0, 0, 0]), float(_SHIFT[1, 0, 0]), float(_SHIFT[2, 0, 0])),
)


class DbNetDecoder:
    """Decoder for DBNet probability maps; axis-aligned boxes of text lines."""

    def __init__(self, info: ModelInfo, options: DecodeOptions) -> None:
        _check_output(info)
        size = convolutional_size(info, KIND, SIZE_MULTIPLE)
        self._in_graph = composed(info, KIND, PROLOGUE)
        self._fixed = None if size is None else Resize(size)
        self._labels = (info.labels[0],) if info.labels else ("text",)
        self._options = options

    @staticmethod
    def prologue(info: ModelInfo) -> Prologue:
        """The cast and the ImageNet normalisation, channels kept in BGR order."""
        convolutional_size(info, KIND, SIZE_MULTIPLE)
        return PROLOGUE

    def preprocess(self, image: Image) -> tuple[Tensor, Transform]:
        """BGR frame -> float32 [3,H,W] BGR, ImageNet-normalised, H and W multiples of 32;
        with the graph prologue, the resized BGR uint8 HxWx3 image."""
        h, w = image.shape[:2]
        resize = self._fixed or limited_resize(w, h)
        resized, transform = resize(image)
        if self._in_graph:
            return bgr_sample(resized), transform
        planes = np.stack(cv2.split(resized), dtype=np.float32)  # (3, H, W), B G R
        planes *= _SCALE
        planes += _SHIFT
        return planes, transform

    def decode(self, outputs: Sequence[Tensor], transform: Transform) -> Detections:
        """Probability map -> scored, unclipped text boxes in frame pixels."""
        prob = np.asarray(outputs[0], np.float32).reshape(outputs[0].shape[-2:])
        bitmap = (prob > BINARY_THRESHOLD).astype(np.uint8)
        contours, _ = cv2.findContours(bitmap, cv2.RETR_LIST, cv2.CHAIN_APPROX_SIMPLE)
        rects = [cv2.minAreaRect(c) for c in contours[:MAX_CANDIDATES]]
        rects = [r for r in rects if min(r[1]) >= MIN_SIDE]
        scores = np.array([box_score(prob, r) for r in rects], np.float32)
        keep = np.flatnonzero(scores >= self._options.confidence)
        keep = keep[np.argsort(-scores[keep], kind="stable")][: self._options.max_detections]
        if len(keep) == 0:
            return Detections.empty()
        xyxy, sides = unclipped_boxes([rects[i] for i in keep], UNCLIP_RATIO)
        big = sides >= MIN_SIDE + 2  # DBPostProcess drops boxes still this small after
        return Detections.from_arrays(
            boxes_to_frame(xyxy[big], transform),
            scores[keep][big],
            np.zeros(int(big.sum()), np.int64),
            self._labels,
        )


@functools.lru_cache(maxsize=16)  # one entry per frame size; a stream has one
def limited_resize(w: int, h: int) -> Resize:
    """The resize of a w x h frame: long side <= LIMIT_SIDE, sides rounded to 32."""
    ratio = min(1.0, LIMIT_SIDE / max(w, h))
    return Resize((_round_to_multiple(w * ratio), _round_to_multiple(h * ratio)))


def box_score(prob: FloatArray, rect: cv2.typing.RotatedRect) -> float:
    """Mean probability inside a rotated rectangle (DBPostProcess.box_score_fast)."""
    corners = cv2.boxPoints(rect)
    h, w = prob.shape
    x0, y0 = np.clip(np.floor(corners.min(0)).astype(int), 0, [w - 1, h - 1])
    x1, y1 = np.clip(np.ceil(corners.max(0)).astype(int), 0, [w - 1, h - 1])
    mask = np.zeros((y1 - y0 + 1, x1 - x0 + 1), np.uint8)
    cv2.fillPoly(mask, [np.rint(corners - (x0, y0)).astype(np.int32)], 1)
    return float(cv2.mean(prob[y0 : y1 + 1, x0 : x1 + 1], mask)[0])


def unclipped_boxes(
    rects: Sequence[cv2.typing.RotatedRect], ratio: float
) -> tuple[FloatArray, FloatArray]:
    """Rotated rectangles grown by area * ratio / perimeter on every side -> their
    axis-aligned xyxy boxes (N, 4) and the grown rectangles' shorter sides (N,)."""
    centre = np.array([r[0] for r in rects], np.float32).reshape(-1, 2)
    size = np.array([r[1] for r in rects], np.float32).reshape(-1, 2)
    theta = np.radians(np.array([r[2] for r in rects], np.float32))
    distance = size.prod(1) * ratio / (2 * size.sum(1))  # pyclipper offset distance
    grown = size + 2 * distance[:, None]
    cos, sin = np.abs(np.cos(theta)), np.abs(np.sin(theta))
    half = 0.5 * np.stack(
        [grown[:, 0] * cos + grown[:, 1] * sin, grown[:, 0] * sin + grown[:, 1] * cos], 1
    )
    return np.concatenate([centre - half, centre + half], 1), grown.min(1)


def _round_to_multiple(value: float) -> int:
    return max(SIZE_MULTIPLE, round(value / SIZE_MULTIPLE) * SIZE_MULTIPLE)


def _check_output(info: ModelInfo) -> None:
    """One rank-4 output with one channel: the text probability map."""
    outputs = info.outputs
    if len(outputs) == 1 and len(outputs[0].shape) == 4 and dim_is(outputs[0].shape[1], 1):
        return
    expected = "one output [N,1,H,W] (the text probability map)"
    raise mismatch(info, KIND, expected, describe(outputs) or "no outputs")
