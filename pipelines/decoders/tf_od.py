"""TensorFlow Object Detection API SSD exports (e.g. configs/models/person_ssdlite.onnx).

Input: uint8 [N,H,W,3] RGB; the graph normalises itself. The frame is stretched to the
input size without keeping aspect ratio, as the TF-OD SSD preprocessor does (300x300
unless the config or the model fixes another size).

Outputs are matched by name (a ':0' suffix and any 'scope/' prefix ignored):
`detection_boxes` [N,K,4] as [ymin, xmin, ymax, xmax] normalised 0..1,
`detection_scores` [N,K], `detection_classes` [N,K] float ids, `num_detections` [N].
NMS is already inside the graph, so rows are only filtered and capped here.

Class ids and labels: `class_id` is the model's own id. TF-OD ids are 1-based (0 is the
background class, COCO person = 1), so `labels` are read as the label map in id order
starting at id 1: `labels[0]` names id 1 (`labels: [person]` names the person model's
class 1). If `labels[0]` is a background entry ('background', '__background__', '???',
'n/a' or ''), the list is instead indexed by id directly, which accepts the common
91-entry COCO lists that start with a background placeholder.
"""

from __future__ import annotations

from collections.abc import Sequence

import cv2
import numpy as np

from pipelines.decoders.base import (
    DecodeOptions,
    Transform,
    check_image_input,
    describe,
    mismatch,
    resolve_size,
)
from pipelines.decoders.prologue import Prologue
from pipelines.decoders.resize import Resize, boxes_to_frame
from pipelines.models import ModelInfo, Tensor, TensorInfo
from pipelines.types import Detections, FloatArray, Image

KIND = "tf_od"
DEFAULT_SIZE = (300, 300)  # SSD MobileNet input; the graph resizes to it anyway
OUTPUT_NAMES = ("detection_boxes", "detection_scores", "detection_classes", "num_detections")
_RANKS = (3, 2, 2, 1)  # with the batch dim, in OUTPUT_NAMES order
BACKGROUND_NAMES = frozenset({"background", "__background__", "???", "n/a", ""})
_YX_TO_XY = [1, 0, 3, 2]  # [ymin, xmin, ymax, xmax] -> [xmin, ymin, xmax, ymax]


class TfOdDecoder:
    """Decoder for TF-OD API detection graphs (boxes/scores/classes/num_detections)."""

    def __init__(self, info: ModelInfo, options: DecodeOptions) -> None:
        self._index = _match_outputs(info)
        image = check_image_input(info, KIND, "NHWC", ("uint8",))
        size = resolve_size(info, KIND, image) or DEFAULT_SIZE
        self._resize = Resize(size)
        # Boxes come normalised to the model input; scale them to its pixels once here.
        self._box_scale = np.array([size[0], size[1]] * 2, np.float32)
        self._labels = labels_by_id(info.labels)
        self._options = options

    @staticmethod
    def prologue(info: ModelInfo) -> Prologue | None:
        """None: the sample is uint8 already and the graph does its own float work; the
        host's one cvtColor of a 300x300 image costs about 30 µs."""
        return None

    def preprocess(self, image: Image) -> tuple[Tensor, Transform]:
        """BGR frame -> uint8 HxWx3 RGB sample at the input size."""
        resized, transform = self._resize(image)
        return cv2.cvtColor(resized, cv2.COLOR_BGR2RGB), transform

    def decode(self, outputs: Sequence[Tensor], transform: Transform) -> Detections:
        """Keep rows with score >= confidence (at most max_detections), boxes in frame px."""
        boxes, scores, classes, count = (np.asarray(outputs[i], np.float32) for i in self._index)
        n = min(int(np.asarray(count).reshape(-1)[0]), scores.shape[0])
        rows = np.flatnonzero(scores[:n] >= self._options.confidence)
        if len(rows) > self._options.max_detections:  # the graph sorts, but do not rely on it
            best = np.argsort(-scores[rows], kind="stable")
            rows = rows[best[: self._options.max_detections]]
        if len(rows) == 0:
            return Detections.empty()
        xyxy: FloatArray = boxes[rows][:, _YX_TO_XY] * self._box_scale
        return Detections.from_arrays(
            boxes_to_frame(xyxy, transform),
            scores[rows],
            np.rint(classes[rows]).astype(np.int64),
            self._labels,
        )


def labels_by_id(labels: Sequence[str]) -> tuple[str, ...]:
    """Labels indexed by TF-OD class id (see the module docstring for the rule)."""
    if not labels or labels[0].strip().lower() in BACKGROUND_NAMES:
        return tuple(labels)
    return ("background", *labels)


def _match_outputs(info: ModelInfo) -> tuple[int, int, int, int]:
    """Output indices in OUTPUT_NAMES order, or DecoderError naming what the model has."""
    found = [_find(info.outputs, key) for key in OUTPUT_NAMES]
    index = tuple(i for i in found if i is not None)
    if len(index) != len(OUTPUT_NAMES):
        raise mismatch(
            info, KIND, f"outputs {'/'.join(OUTPUT_NAMES)}", ", ".join(o.name for o in info.outputs)
        )
    tensors = [info.outputs[i] for i in index]
    if any(len(t.shape) != r for t, r in zip(tensors, _RANKS, strict=True)):
        expected = "outputs of rank 3/2/2/1 (boxes [N,K,4], scores, classes [N,K], count [N])"
        raise mismatch(info, KIND, expected, describe(tensors))
    return index[0], index[1], index[2], index[3]


def _find(outputs: Sequence[TensorInfo], key: str) -> int | None:
    """The output named `key`, else the only one whose name contains it. TF2 exports
    also have `raw_detection_boxes` (boxes before NMS): never take a `raw_` output."""
    bases = [o.name.rsplit("/", 1)[-1].removesuffix(":0") for o in outputs]
    exact = [i for i, b in enumerate(bases) if b == key]
    loose = [i for i, b in enumerate(bases) if key in b and not b.startswith("raw_")]
    if exact:
        return exact[0]
    return loose[0] if len(loose) == 1 else None
