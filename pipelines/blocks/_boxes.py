"""Box maths shared by `crop` and `blur`: padding, squaring and clipping, vectorised.

Detections carry float xyxy boxes in frame pixels; slicing needs integer boxes inside the
frame. `pixel_boxes` does that for all N boxes at once, so the per-box Python work left to
a block is the slice itself.
"""

from __future__ import annotations

from typing import Annotated

import numpy as np
import numpy.typing as npt
from pydantic import Field

from pipelines.blocks.base import BlockParams

IntBoxes = npt.NDArray[np.int64]  # (N, 4) x1, y1, x2, y2: half-open pixel ranges


class PaddedBoxParams(BlockParams):
    """Padding around each box, on every side: a fraction of the box's own size plus
    a fixed number of pixels (both may be set; they add up)."""

    padding: Annotated[float, Field(ge=0.0, le=10.0)] = 0.0  # 0.1: 10 % of width / height
    padding_px: Annotated[int, Field(ge=0, le=10_000)] = 0


def pixel_boxes(
    xyxy: npt.NDArray[np.float32],
    width: int,
    height: int,
    padding: float = 0.0,
    padding_px: int = 0,
    square: bool = False,
) -> IntBoxes:
    """Integer boxes inside a width x height frame: padded, optionally squared, clipped.

    `padding` is a fraction of each box's width (left and right) and height (top and
    bottom), `padding_px` pixels on every side. `square` grows the shorter side to the
    longer one around the centre, then shifts the box into the frame where it fits, so
    that a classifier sees undistorted content even at the frame's edges. Edges round
    outwards (floor x1, y1; ceil x2, y2): a box never loses a partly covered pixel.
    Boxes outside the frame come back empty (x2 <= x1 or y2 <= y1).
    """
    boxes = xyxy.astype(np.float64)  # float64: exact integer edges up to any frame size
    size = boxes[:, 2:] - boxes[:, :2]  # (N, 2) width, height
    pad = size * padding + padding_px
    lo, hi = boxes[:, :2] - pad, boxes[:, 2:] + pad
    if square:
        centre, half = (lo + hi) / 2, (hi - lo).max(axis=1, keepdims=True) / 2
        lo, hi = centre - half, centre + half
        frame = np.array([width, height], np.float64)
        # Move right/down by what sticks out on the low side, left/up by the high side.
        shift = np.maximum(-lo, 0.0) - np.maximum(hi - frame, 0.0)
        lo, hi = lo + shift, hi + shift
    out = np.concatenate([np.floor(lo), np.ceil(hi)], axis=1).astype(np.int64)
    out[:, 0::2] = np.clip(out[:, 0::2], 0, width)
    out[:, 1::2] = np.clip(out[:, 1::2], 0, height)
    return out


def box_sizes(boxes: IntBoxes) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
    """Widths and heights of integer boxes (0 or less for empty ones)."""
    return boxes[:, 2] - boxes[:, 0], boxes[:, 3] - boxes[:, 1]
