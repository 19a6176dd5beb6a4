"""Box geometry for tracking: xyxy <-> xyah, IoU matrices and anchor points.

All functions take (N, 4) float arrays of pixel xyxy boxes and are vectorised.
"""

from __future__ import annotations

from typing import Literal

import numpy as np
import numpy.typing as npt

Anchor = Literal["center", "bottom_center"]
F64 = npt.NDArray[np.float64]
AnyFloat = npt.NDArray[np.floating]

_EPS = 1e-9  # px²; keeps IoU finite for degenerate (zero-area) boxes


def xyxy_to_xyah(xyxy: AnyFloat) -> F64:
    """(cx, cy, w/h, h): the Kalman measurement space of ByteTrack (and DeepSORT)."""
    b = np.asarray(xyxy, np.float64)
    out = np.empty((b.shape[0], 4))  # filled by column: cheaper than np.stack for few rows
    h = np.maximum(b[:, 3] - b[:, 1], _EPS)  # a zero-height box would divide by zero
    out[:, 0] = (b[:, 0] + b[:, 2]) / 2
    out[:, 1] = (b[:, 1] + b[:, 3]) / 2
    out[:, 2] = (b[:, 2] - b[:, 0]) / h
    out[:, 3] = h
    return out


def xyah_to_xyxy(xyah: AnyFloat) -> F64:
    """Inverse of `xyxy_to_xyah`; negative sizes from a diverged prediction clip to 0."""
    h = np.maximum(xyah[:, 3], 0.0)
    w = np.maximum(xyah[:, 2] * h, 0.0)
    cx, cy = xyah[:, 0], xyah[:, 1]
    out = np.empty((xyah.shape[0], 4))
    out[:, 0], out[:, 1] = cx - w / 2, cy - h / 2
    out[:, 2], out[:, 3] = cx + w / 2, cy + h / 2
    return out


def iou_matrix(a: AnyFloat, b: AnyFloat) -> F64:
    """(len(a), len(b)) intersection over union of two box sets."""
    a64, b64 = np.asarray(a, np.float64), np.asarray(b, np.float64)
    lt = np.maximum(a64[:, None, :2], b64[None, :, :2])
    rb = np.minimum(a64[:, None, 2:], b64[None, :, 2:])
    wh = np.clip(rb - lt, 0.0, None)
    inter = wh[..., 0] * wh[..., 1]
    area_a = (a64[:, 2] - a64[:, 0]) * (a64[:, 3] - a64[:, 1])
    area_b = (b64[:, 2] - b64[:, 0]) * (b64[:, 3] - b64[:, 1])
    union = area_a[:, None] + area_b[None, :] - inter
    result: F64 = inter / np.maximum(union, _EPS)
    return result


def anchor_points(xyxy: AnyFloat, anchor: Anchor) -> F64:
    """(N, 2) pixel points: the box centre, or its bottom-centre ("feet" on the ground)."""
    b = np.asarray(xyxy, np.float64)
    x = (b[:, 0] + b[:, 2]) / 2
    y = (b[:, 1] + b[:, 3]) / 2 if anchor == "center" else b[:, 3]
    return np.stack([x, y], axis=1)
