"""A counting line and a zone polygon, resolved to pixels once per frame size.

Each stream gets its own instance (the pixel cache is per frame size and not shared
between threads). Points are (N, 2) float64 pixel arrays, e.g. from `anchor_points`.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from pipelines.geometry import Points, Units
from pipelines.tracking.boxes import F64

Bools = npt.NDArray[np.bool_]


class Line:
    """The segment p1→p2. Side +1 is the right of p1→p2 as seen on screen (y down)."""

    def __init__(self, points: Sequence[Sequence[float]], units: Units, margin_px: float) -> None:
        self._points = Points(points, units)
        self._margin = margin_px
        self._size = (-1, -1)
        self._p1 = self._d = np.zeros(2)
        self._len = 1.0

    def _resolve(self, width: int, height: int) -> None:
        if (width, height) != self._size:
            px = self._points.pixels(width, height).astype(np.float64)
            self._p1, self._d = px[0], px[-1] - px[0]
            self._len = max(float(np.hypot(*self._d)), 1e-9)  # px; a point "line" never counts
            self._size = (width, height)

    def cross(self, points: F64, width: int, height: int) -> F64:
        """Signed distance (px) of each point from the line: > 0 on the right side."""
        self._resolve(width, height)
        rel = points - self._p1
        result: F64 = (self._d[0] * rel[:, 1] - self._d[1] * rel[:, 0]) / self._len
        return result

    def side(self, dist: F64) -> npt.NDArray[np.int8]:
        """+1 / −1 by side; 0 within `margin_px` of the line (the jitter dead band)."""
        return (dist > self._margin).astype(np.int8) - (dist < -self._margin).astype(np.int8)

    def within(self, a: F64, dist_a: F64, b: F64, dist_b: F64) -> Bools:
        """Whether the move a→b (on opposite sides) meets the line between p1 and p2."""
        frac = dist_a / np.where(dist_a == dist_b, 1.0, dist_a - dist_b)
        hit = a + frac[:, None] * (b - a)
        along = ((hit - self._p1) @ self._d) / (self._len * self._len)
        result: Bools = (along >= 0.0) & (along <= 1.0)
        return result


class Zone:
    """A polygon; `contains` is the even-odd rule, vectorised over points × edges."""

    def __init__(self, points: Sequence[Sequence[float]], units: Units) -> None:
        self._points = Points(points, units)
        self._size = (-1, -1)
        self._edges = np.zeros((4, 0))

    def _resolve(self, width: int, height: int) -> F64:
        if (width, height) != self._size:
            px = self._points.pixels(width, height).astype(np.float64)
            x0, y0 = px[:, 0], px[:, 1]
            x1, y1 = np.roll(x0, -1), np.roll(y0, -1)
            dy = y1 - y0
            # x where each edge meets a horizontal ray, as x0 + (y − y0)·slope; a flat
            # edge never straddles the ray, so its slope is never used (set 0, no ÷0).
            slope = np.where(dy == 0, 0.0, (x1 - x0) / np.where(dy == 0, 1.0, dy))
            self._edges = np.stack([x0, y0, y1, slope])
            self._size = (width, height)
        return self._edges

    def contains(self, points: F64, width: int, height: int) -> Bools:
        x0, y0, y1, slope = self._resolve(width, height)
        px, py = points[:, :1], points[:, 1:]
        straddles = (y0 > py) != (y1 > py)
        crossings = straddles & (px < x0 + (py - y0) * slope)
        result: Bools = (np.count_nonzero(crossings, axis=1) % 2).astype(bool)
        return result
