"""`line_counter`: count tracks crossing a line, by direction.

```yaml
- id: door
  type: line_counter
  tracks: tracks             # a `track` block's output
  line: [[0.1, 0.6], [0.9, 0.6]]
  units: auto                # auto | px | norm (auto: all coordinates in 0..1 = norm)
  anchor: bottom_center      # center | bottom_center: the box point that must cross
  margin_px: 2.0             # dead band either side of the line, px
  min_frames_on_side: 2      # frames on the new side before a crossing counts
```

Output (`counts`): `{"in": int, "out": int, "total": int}`, cumulative per stream.

"in" is a move from the left of p1→p2 to its right, as seen on screen: for a line drawn
left to right, moving down the image is "in"; swap the points to swap the directions.
A crossing counts when the anchor of one track id, last seen on one side, is seen on the
other side for `min_frames_on_side` consecutive observations, and the step between the two
observations meets the line between p1 and p2 (going around an end does not count, it
only moves the track to the other side). Anchors within `margin_px` of the infinite line
change nothing, so jitter around the line cannot count twice. The first observation of an
id only records its side. State of ids unseen for `forget_after_frames` is dropped.
"""

from __future__ import annotations

from typing import Annotated, Any

import numpy as np
from pydantic import Field

from pipelines.blocks.base import BlockParams, BlockType, BuildContext, StepFactory
from pipelines.geometry import Units
from pipelines.tracking.boxes import F64, Anchor, anchor_points
from pipelines.tracking.idtable import IdTable
from pipelines.tracking.regions import Line
from pipelines.types import Detections, Frame, IntArray

Segment = Annotated[list[tuple[float, float]], Field(min_length=2, max_length=2)]


class LineCounterParams(BlockParams):
    line: Segment
    units: Units = "auto"
    anchor: Anchor = "bottom_center"
    margin_px: Annotated[float, Field(ge=0.0)] = 2.0
    min_frames_on_side: Annotated[int, Field(ge=1, le=1000)] = 2
    forget_after_frames: Annotated[int, Field(ge=1)] = 600  # 20 s at 30 fps


class LineCounterBlock(BlockType):
    type_name = "line_counter"
    description = "Count tracks crossing a line, in and out."
    Params = LineCounterParams
    inputs = {"tracks": ("tracks", None)}
    outputs = {"counts": "counts"}
    wants_frame = True  # normalised lines resolve against the frame size

    @classmethod
    def build(cls, params: Any, ctx: BuildContext) -> StepFactory:
        p: LineCounterParams = params
        return lambda: _LineCount(p).step


class _LineCount:
    """One stream's counter. Per id: committed side, frames seen on the other side, the
    last anchor on the committed side, and whether the pending move meets the segment."""

    def __init__(self, p: LineCounterParams) -> None:
        self.line = Line(p.line, p.units, p.margin_px)
        self.anchor = p.anchor
        self.needed = p.min_frames_on_side
        self.forget_after = p.forget_after_frames
        self.table = IdTable(
            {
                "side": (np.int8, 0),
                "run": (np.int32, 0),
                "within": (bool, False),
                "x": (np.float64, 0.0),
                "y": (np.float64, 0.0),
                "dist": (np.float64, 0.0),
                "seen": (np.int64, 0),
            }
        )
        self.frame = 0
        self.n_in = self.n_out = 0

    def step(self, tracks: Detections, frame: Frame) -> dict[str, int]:
        self.frame += 1
        if tracks.tracker_id is not None and len(tracks):
            self._observe(tracks.tracker_id, anchor_points(tracks.xyxy, self.anchor), frame)
        table = self.table
        stale = self.frame - table.col["seen"] > self.forget_after
        if stale.any():
            table.forget(stale)
        return {"in": self.n_in, "out": self.n_out, "total": self.n_in + self.n_out}

    def _observe(self, ids: IntArray, pts: F64, frame: Frame) -> None:
        rows, _ = self.table.lookup(ids)
        c = self.table.col
        dist = self.line.cross(pts, frame.width, frame.height)
        now = self.line.side(dist)
        side = c["side"][rows]
        c["seen"][rows] = self.frame
        # home: on the committed side, or a first side for an id seen only in the dead
        # band (or not at all) so far; away: on the other side, counting frames there.
        home = (now != 0) & ((side == 0) | (now == side))
        away = (now != 0) & (side != 0) & (now != side)
        first = away & (c["run"][rows] == 0)
        if first.any():  # where the step from the last home anchor meets the line
            r = rows[first]
            last = np.stack([c["x"][r], c["y"][r]], axis=1)
            c["within"][r] = self.line.within(last, c["dist"][r], pts[first], dist[first])
        c["run"][rows[away]] += 1
        done = away & (c["run"][rows] >= self.needed)
        counted = done & c["within"][rows]
        self.n_in += int(np.count_nonzero(counted & (now > 0)))
        self.n_out += int(np.count_nonzero(counted & (now < 0)))
        settled = home | done
        r = rows[settled]
        c["side"][r], c["run"][r], c["dist"][r] = now[settled], 0, dist[settled]
        c["x"][r], c["y"][r] = pts[settled, 0], pts[settled, 1]
