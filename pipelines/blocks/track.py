"""`track`: give detections stable per-stream ids with ByteTrack.

```yaml
- id: tracks
  type: track
  detections: people     # any detections output
  high_threshold: 0.5    # first-stage boxes score above this
  low_threshold: 0.1     # weaker boxes (≤ high) can only extend existing tracks
  birth_threshold: 0.6   # a new track needs a box scoring at least this
  match_iou: 0.2         # stage-1 match needs IoU × score above this
  track_buffer: 30       # frames a lost track waits to be found again
  min_hits: 2            # consecutive matches before a track is output
```

The output is a `tracks` value: the matched detections (boxes, classes and scores as
detected this frame) with `tracker_id` set; ids start at 1 in each stream and only grow.
The tracker itself is `pipelines.tracking.bytetrack` (why ByteTrack, why no package: see
there).
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import Field, model_validator

from pipelines.blocks.base import BlockParams, BlockType, BuildContext, StepFactory, StepFn
from pipelines.tracking.bytetrack import ByteTracker, TrackerConfig

Score = Annotated[float, Field(ge=0.0, le=1.0)]
Similarity = Annotated[float, Field(gt=0.0, lt=1.0)]


class TrackParams(BlockParams):
    high_threshold: Score = 0.5
    low_threshold: Score = 0.1
    birth_threshold: Score | None = None  # default: high_threshold + 0.1 (ByteTrack's)
    match_iou: Similarity = 0.2
    low_match_iou: Similarity = 0.5
    new_match_iou: Similarity = 0.3
    track_buffer: Annotated[int, Field(ge=0, le=10_000)] = 30  # frames
    min_hits: Annotated[int, Field(ge=1, le=10)] = 2  # frames
    max_tracks: Annotated[int, Field(ge=1, le=100_000)] = 1000

    @model_validator(mode="after")
    def _ordered(self) -> TrackParams:
        if self.low_threshold > self.high_threshold:
            raise ValueError(
                f"low_threshold ({self.low_threshold}) must not exceed "
                f"high_threshold ({self.high_threshold})"
            )
        return self

    def config(self) -> TrackerConfig:
        birth = self.birth_threshold
        return TrackerConfig(
            high_threshold=self.high_threshold,
            low_threshold=self.low_threshold,
            birth_threshold=min(self.high_threshold + 0.1, 1.0) if birth is None else birth,
            match_iou=self.match_iou,
            low_match_iou=self.low_match_iou,
            new_match_iou=self.new_match_iou,
            track_buffer=self.track_buffer,
            min_hits=self.min_hits,
            max_tracks=self.max_tracks,
        )


class TrackBlock(BlockType):
    type_name = "track"
    description = "Multi-object tracking (ByteTrack): detections -> tracks with stable ids."
    Params = TrackParams
    inputs = {"detections": ("detections", None)}
    outputs = {"tracks": "tracks"}

    @classmethod
    def build(cls, params: Any, ctx: BuildContext) -> StepFactory:
        config = params.config()

        def factory() -> StepFn:
            return ByteTracker(config).update  # fresh tracker, fresh ids: one per stream

        return factory
