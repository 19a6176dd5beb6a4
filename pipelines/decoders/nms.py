"""Non-maximum suppression through OpenCV's C++ implementation (`cv2.dnn.NMSBoxes*`).

OpenCV measures overlap as IoU of (x, y, w, h) rectangles without the +1 pixel
convention, suppresses a box whose IoU with a better-scored kept box is *above*
`iou`, and returns the kept indices best first. It keeps only scores strictly above its
score threshold, which must be >= 0: callers filter by confidence first and we pass 0,
so a box scored exactly 0 is dropped.
"""

from __future__ import annotations

from typing import Any

import cv2
import numpy as np
import numpy.typing as npt

from pipelines.types import FloatArray, IntArray

IndexArray = npt.NDArray[np.intp]


def nms(
    xyxy: FloatArray,
    scores: FloatArray,
    iou: float,
    max_detections: int,
    class_ids: IntArray | None = None,
) -> IndexArray:
    """Indices of the boxes to keep, best score first, at most `max_detections`.

    With `class_ids`, boxes suppress only boxes of their own class (class-aware NMS).
    """
    if len(scores) == 0 or max_detections <= 0:
        return np.zeros((0,), np.intp)
    xywh = xyxy.astype(np.float64)  # cv2 reads an (N, 4) float64 array as Rect2d boxes
    xywh[:, 2:] -= xywh[:, :2]
    # NMSBoxesBatched separates classes by shifting each by class_id * (max coord + 1),
    # which only holds for non-negative boxes; a translation does not change any IoU.
    xywh[:, :2] -= min(0.0, float(xywh[:, :2].min()))
    # The stubs say Sequence; cv2 reads numpy arrays directly, without a Python list.
    boxes: Any = xywh
    score_list: Any = scores.astype(np.float32, copy=False)
    if class_ids is None:
        kept = cv2.dnn.NMSBoxes(boxes, score_list, 0.0, iou)
    else:
        ids: Any = class_ids.astype(np.int32, copy=False)
        kept = cv2.dnn.NMSBoxesBatched(boxes, score_list, ids, 0.0, iou)
    return np.asarray(kept, np.intp).reshape(-1)[:max_detections]
