"""NMS through OpenCV: per-class suppression, ordering, caps."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import cv2
import numpy as np

from pipelines.decoders.nms import nms


def boxes(*rows: Sequence[float]) -> np.ndarray:
    return np.array(rows, np.float32)


def scores(*values: float) -> np.ndarray:
    return np.array(values, np.float32)


def test_overlapping_boxes_keep_the_best_first() -> None:
    xyxy = boxes([0, 0, 10, 10], [100, 100, 110, 110], [1, 0, 11, 10])  # 3rd: IoU 0.82 with 1st
    kept = nms(xyxy, scores(0.7, 0.6, 0.9), iou=0.5, max_detections=10)
    assert kept.tolist() == [2, 1]


def test_iou_threshold_is_exclusive_of_lower_overlaps() -> None:
    xyxy = boxes([0, 0, 10, 10], [4, 0, 14, 10])  # IoU 60/140 = 0.43
    assert nms(xyxy, scores(0.9, 0.8), iou=0.5, max_detections=10).tolist() == [0, 1]
    assert nms(xyxy, scores(0.9, 0.8), iou=0.4, max_detections=10).tolist() == [0]


def test_classes_do_not_suppress_each_other() -> None:
    xyxy = boxes([0, 0, 10, 10], [0, 0, 10, 10])
    ids = np.array([0, 1], np.int64)
    assert nms(xyxy, scores(0.9, 0.8), 0.5, 10, class_ids=ids).tolist() == [0, 1]
    assert nms(xyxy, scores(0.9, 0.8), 0.5, 10).tolist() == [0]


def test_classes_stay_apart_with_negative_coordinates() -> None:
    # OpenCV shifts class k by k * (max coordinate + 1); a box left of 0 would then land
    # on a box of the next class. nms() translates all boxes to >= 0 first.
    xyxy = boxes([0, 0, 10, 10], [-11, -11, -1, -1])
    ids = np.array([0, 1], np.int64)
    xywh: Any = np.array([[0, 0, 10, 10], [-11, -11, 10, 10]], np.float64)
    raw = cv2.dnn.NMSBoxesBatched(xywh, [0.9, 0.8], [0, 1], 0.0, 0.5)
    assert list(raw) == [0]  # the pitfall this guards against
    assert nms(xyxy, scores(0.9, 0.8), 0.5, 10, class_ids=ids).tolist() == [0, 1]


def test_max_detections_and_empty_input() -> None:
    xyxy = boxes(*([i * 20, 0, i * 20 + 10, 10] for i in range(5)))
    kept = nms(xyxy, scores(0.1, 0.5, 0.3, 0.9, 0.7), 0.5, max_detections=2)
    assert kept.tolist() == [3, 4]
    assert nms(boxes(), scores(), 0.5, 10).tolist() == []
