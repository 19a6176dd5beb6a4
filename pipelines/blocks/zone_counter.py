"""`zone_counter`: how many tracks are inside a polygon, and how many entered and left.

```yaml
- id: queue
  type: zone_counter
  tracks: tracks             # a `track` block's output
  zone: [[0.2, 0.5], [0.8, 0.5], [0.8, 1.0], [0.2, 1.0]]
  units: auto                # auto | px | norm (auto: all coordinates in 0..1 = norm)
  anchor: bottom_center      # center | bottom_center: the box point that must be inside
  min_frames: 2              # frames on the other side of the edge before a change counts
  lost_after_frames: 30      # an absent track inside counts as exited after this
```

Output (`counts`): `{"inside": int, "entered": int, "exited": int}` per stream; `entered`
and `exited` are cumulative and `inside == entered − exited` always holds.

A track first seen inside counts as entered at once. After that its state flips only when
its anchor is seen on the other side of the zone's edge for `min_frames` consecutive
observations (so a box jittering on the edge does not count twice). A track inside that
is not seen for more than `lost_after_frames` frames (the `track` block's default
`track_buffer`: by then the tracker has dropped its id too) counts as exited.
"""

from __future__ import annotations

from typing import Annotated, Any

import numpy as np
from pydantic import Field

from pipelines.blocks.base import BlockParams, BlockType, BuildContext, StepFactory
from pipelines.geometry import Polygon, Units
from pipelines.tracking.boxes import F64, Anchor, anchor_points
from pipelines.tracking.idtable import IdTable
from pipelines.tracking.regions import Zone
from pipelines.types import Detections, Frame, IntArray


class ZoneCounterParams(BlockParams):
    zone: Polygon
    units: Units = "auto"
    anchor: Anchor = "bottom_center"
    min_frames: Annotated[int, Field(ge=1, le=1000)] = 2
    lost_after_frames: Annotated[int, Field(ge=0)] = 30


class ZoneCounterBlock(BlockType):
    type_name = "zone_counter"
    description = "Count tracks inside a polygon zone, and entries and exits."
    Params = ZoneCounterParams
    inputs = {"tracks": ("tracks", None)}
    outputs = {"counts": "counts"}
    wants_frame = True  # normalised zones resolve against the frame size

    @classmethod
    def build(cls, params: Any, ctx: BuildContext) -> StepFactory:
        p: ZoneCounterParams = params
        return lambda: _ZoneCount(p).step


class _ZoneCount:
    """One stream's counter. Per id: inside or not, frames seen the other way, last seen."""

    def __init__(self, p: ZoneCounterParams) -> None:
        self.zone = Zone(p.zone, p.units)
        self.anchor = p.anchor
        self.needed = p.min_frames
        self.lost_after = p.lost_after_frames
        self.table = IdTable({"inside": (bool, False), "run": (np.int32, 0), "seen": (np.int64, 0)})
        self.frame = 0
        self.entered = self.exited = 0

    def step(self, tracks: Detections, frame: Frame) -> dict[str, int]:
        self.frame += 1
        if tracks.tracker_id is not None and len(tracks):
            self._observe(tracks.tracker_id, anchor_points(tracks.xyxy, self.anchor), frame)
        c = self.table.col
        gone = self.frame - c["seen"] > self.lost_after
        if gone.any():
            self.exited += int(np.count_nonzero(c["inside"][gone]))
            self.table.forget(gone)
        inside = self.entered - self.exited
        return {"inside": inside, "entered": self.entered, "exited": self.exited}

    def _observe(self, ids: IntArray, pts: F64, frame: Frame) -> None:
        rows, new = self.table.lookup(ids)
        c = self.table.col
        now = self.zone.contains(pts, frame.width, frame.height)
        c["seen"][rows] = self.frame
        self.entered += int(np.count_nonzero(new & now))
        c["inside"][rows[new]] = now[new]
        changing = ~new & (now != c["inside"][rows])
        c["run"][rows] = np.where(changing, c["run"][rows] + 1, 0)
        flip = changing & (c["run"][rows] >= self.needed)
        self.entered += int(np.count_nonzero(flip & now))
        self.exited += int(np.count_nonzero(flip & ~now))
        c["inside"][rows[flip]] = now[flip]
        c["run"][rows[flip]] = 0
