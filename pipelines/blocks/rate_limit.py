"""`rate_limit`: pass a value on some frames only, so that costly blocks after it run less.

```yaml
- id: every_second
  type: rate_limit
  value: people           # any output: detections, an image, crops, ...
  every_s: 1.0            # at most once per second of capture time
  # every_n_frames: 5     # or: the first of every 5 frames
```

On the frames it holds back the block returns SKIP: the blocks that read only held
values are skipped too and keep their last outputs (their spans are None), while blocks
that also read a fresh value run, with the held one. The first frame always passes.
Each stream has its own counter and clock.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import Field, model_validator

from pipelines.blocks.base import SKIP, BlockParams, BlockType, BuildContext, StepFactory, StepFn
from pipelines.types import Frame


class RateLimitParams(BlockParams):
    every_n_frames: Annotated[int, Field(ge=1)] | None = None
    every_s: Annotated[float, Field(gt=0.0)] | None = None  # seconds of capture time

    @model_validator(mode="after")
    def _exactly_one(self) -> RateLimitParams:
        if (self.every_n_frames is None) == (self.every_s is None):
            raise ValueError(
                "set exactly one of every_n_frames (a frame count) or every_s (seconds)"
            )
        return self


class RateLimitBlock(BlockType):
    type_name = "rate_limit"
    description = "Pass a value every N frames or every S seconds; skip what depends on it."
    Params = RateLimitParams
    inputs = {"value": ("any", None)}
    outputs = {"value": "like:value"}  # the kind of whatever `value` reads, checked as such
    wants_frame = True  # every_s reads Frame.capture_mono
    may_skip = True

    @classmethod
    def build(cls, params: Any, ctx: BuildContext) -> StepFactory:
        p: RateLimitParams = params
        if p.every_n_frames is not None:
            n = p.every_n_frames
            return lambda: _every_n(n)
        assert p.every_s is not None  # the validator guarantees one of the two
        period = p.every_s
        return lambda: _every_s(period)


def _every_n(n: int) -> StepFn:
    """Passes frames 0, n, 2n, ... of this stream (counted, not by `Frame.seq`, which
    jumps when the grabber drops frames)."""
    seen = -1

    def every_n(value: Any, frame: Frame) -> Any:
        nonlocal seen
        seen += 1
        return value if seen % n == 0 else SKIP

    return every_n


def _every_s(period: float) -> StepFn:
    """Passes a frame when `period` s have gone by on the capture clock since the last
    due time. Due times advance by whole periods so the mean rate is 1/period even when
    frames arrive late; after a gap (stall, reconnect) they restart from now, so there is
    no burst to catch up."""
    due = float("-inf")

    def every_s(value: Any, frame: Frame) -> Any:
        nonlocal due
        now = frame.capture_mono
        if now < due:
            return SKIP
        due += period
        if due <= now:
            due = now + period
        return value

    return every_s
