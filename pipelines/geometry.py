"""Points, lines and zones from block parameters, in pixels or normalised (0-1) units.

The frame size is known only when frames arrive, so a `Points` resolves to pixels on the
first frame of a size and caches the result: one tuple comparison per frame after that.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Annotated, Any, Literal

import numpy as np
import numpy.typing as npt
from pydantic import Field

Units = Literal["auto", "px", "norm"]
# A parameter holding points: [[x, y], ...]. Validated by pydantic in each block's Params.
PointList = Annotated[list[tuple[float, float]], Field(min_length=2)]
Polygon = Annotated[list[tuple[float, float]], Field(min_length=3)]


class Points:
    """Fixed points from a config; `pixels(w, h)` gives them as a float32 (N, 2) array.

    `units="auto"` treats the points as normalised when every coordinate is within 0..1
    (a 1-pixel-wide zone in the corner is not a realistic config), as pixels otherwise.
    """

    def __init__(self, points: Sequence[Sequence[float]], units: Units = "auto") -> None:
        self._raw = np.asarray(points, dtype=np.float32).reshape(-1, 2)
        in_unit_box = bool(np.all((self._raw >= 0.0) & (self._raw <= 1.0)))
        self.normalised = units == "norm" or (units == "auto" and in_unit_box)
        # (size, pixels) in one tuple: one atomic swap, safe if streams share an instance.
        self._cache: tuple[tuple[int, int], npt.NDArray[np.float32]] = ((-1, -1), self._raw)

    def pixels(self, width: int, height: int) -> npt.NDArray[np.float32]:
        size, px = self._cache
        if size != (width, height):
            scale = np.array([width, height], np.float32) if self.normalised else 1.0
            px = (self._raw * scale).astype(np.float32)
            self._cache = ((width, height), px)
        return px

    def __len__(self) -> int:
        return int(self._raw.shape[0])


@dataclass(frozen=True, slots=True)
class Region:
    """A line or zone a block counts against, for viewers to draw over the video:
    `points` as configured, normalised (0-1) when `normalised`, else pixels."""

    block: str
    kind: Literal["line", "zone"]
    points: tuple[tuple[float, float], ...]
    normalised: bool

    def to_json(self) -> dict[str, Any]:
        return {
            "block": self.block,
            "kind": self.kind,
            "points": [list(p) for p in self.points],
            "units": "norm" if self.normalised else "px",
        }


def region_of(block_id: str, params: Any) -> Region | None:
    """The line (`line`) or zone (`zone`) a block's parameters declare, if any."""
    for kind, name in (("line", "line"), ("zone", "zone")):
        points = getattr(params, name, None)
        if isinstance(points, list) and points:
            units: Units = getattr(params, "units", "auto")
            normalised = Points(points, units).normalised
            pts = tuple((float(x), float(y)) for x, y in points)
            return Region(block_id, kind, pts, normalised)  # type: ignore[arg-type]
    return None
