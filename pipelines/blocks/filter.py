"""`filter`: keep the detections that pass every criterion given.

```yaml
- id: people_in_zone
  type: filter
  detections: people         # any detections (or tracks: tracker ids are kept)
  classes: [person, 2]       # class names (matched on class_name) or ids (on class_id)
  min_confidence: 0.4
  min_area: 400              # px², box width × height
  max_area: 200000
  min_width: 10              # px; also max_width, min_height, max_height
  zone: [[0.1, 0.4], [0.9, 0.4], [0.9, 1.0], [0.1, 1.0]]
  units: auto                # auto | px | norm (auto: all coordinates in 0..1 = norm)
  zone_anchor: bottom_center # center | bottom_center: the box point that must be inside
```

Every criterion is optional; a box is kept when it passes all given ones. Box sizes are
in pixels of the frame the detections belong to. The zone uses the even-odd rule.
"""

from __future__ import annotations

from typing import Annotated, Any

import numpy as np
import numpy.typing as npt
from pydantic import Field, model_validator

from pipelines.blocks.base import BlockParams, BlockType, BuildContext, StepFactory, StepFn
from pipelines.geometry import Polygon, Units
from pipelines.tracking.boxes import Anchor, anchor_points
from pipelines.tracking.regions import Zone
from pipelines.types import Detections, Frame

Px = Annotated[float, Field(ge=0.0)]
Bools = npt.NDArray[np.bool_]


class FilterParams(BlockParams):
    classes: list[str | int] | None = None
    min_confidence: Annotated[float, Field(ge=0.0, le=1.0)] | None = None
    min_area: Px | None = None  # px²
    max_area: Px | None = None
    min_width: Px | None = None  # px
    max_width: Px | None = None
    min_height: Px | None = None
    max_height: Px | None = None
    zone: Polygon | None = None
    units: Units = "auto"
    zone_anchor: Anchor = "bottom_center"

    @model_validator(mode="after")
    def _ranges(self) -> FilterParams:
        for what in ("area", "width", "height"):
            low, high = getattr(self, f"min_{what}"), getattr(self, f"max_{what}")
            if low is not None and high is not None and low > high:
                raise ValueError(f"min_{what} ({low}) exceeds max_{what} ({high})")
        return self


class FilterBlock(BlockType):
    type_name = "filter"
    description = "Keep detections by class, confidence, box size and zone."
    Params = FilterParams
    inputs = {"detections": ("detections", None)}
    outputs = {"detections": "like:detections"}  # tracks stay tracks
    wants_frame = True  # normalised zones resolve against the frame size

    @classmethod
    def build(cls, params: Any, ctx: BuildContext) -> StepFactory:
        p: FilterParams = params
        ids = np.asarray(sorted({c for c in p.classes or () if isinstance(c, int)}), np.int64)
        names = frozenset(c for c in p.classes or () if isinstance(c, str))
        # (column, low, high) for each size bound given; columns: 0 width, 1 height, 2 area.
        bounds = [
            (col, low, high)
            for col, low, high in (
                (0, p.min_width, p.max_width),
                (1, p.min_height, p.max_height),
                (2, p.min_area, p.max_area),
            )
            if low is not None or high is not None
        ]

        def factory() -> StepFn:
            zone = None if p.zone is None else Zone(p.zone, p.units)  # per stream: own cache

            def keep(dets: Detections, frame: Frame) -> Detections:
                if not len(dets):
                    return dets
                mask = np.ones(len(dets), bool)
                if p.classes is not None:
                    mask &= _class_mask(dets, ids, names)
                if p.min_confidence is not None:
                    mask &= dets.confidence >= p.min_confidence
                if bounds:
                    mask &= _size_mask(dets, bounds)
                if zone is not None:
                    pts = anchor_points(dets.xyxy, p.zone_anchor)
                    mask &= zone.contains(pts, frame.width, frame.height)
                return dets if mask.all() else dets.select(mask)

            return keep

        return factory


def _class_mask(dets: Detections, ids: npt.NDArray[np.int64], names: frozenset[str]) -> Bools:
    # A broadcast compare beats np.isin (which sorts) for a handful of classes, and a set
    # lookup per name beats building a numpy string array every frame.
    mask: Bools = (dets.class_id[:, None] == ids[None, :]).any(axis=1)
    if names and dets.class_name:
        mask |= np.fromiter((n in names for n in dets.class_name), bool, len(dets))
    return mask


def _size_mask(dets: Detections, bounds: list[tuple[int, float | None, float | None]]) -> Bools:
    wh = dets.xyxy[:, 2:] - dets.xyxy[:, :2]
    sizes = np.concatenate([wh, wh[:, :1] * wh[:, 1:]], axis=1)  # (N, 3): w, h, area
    mask = np.ones(len(dets), bool)
    for col, low, high in bounds:
        if low is not None:
            mask &= sizes[:, col] >= low
        if high is not None:
            mask &= sizes[:, col] <= high
    return mask
