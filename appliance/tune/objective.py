"""What the tuner maximises, one score per window (higher is better), so two settings
compare by the ratio of their scores.

- `fps` (default): the most processed frames per second with frame-age p99 under the
  SLO (default two frame intervals of the cameras). A window over the SLO scores its
  fps times SLO/p99: below saturation every setting processes every frame, and the
  fresher one wins; at saturation no setting may meet the SLO, and the one with more
  frames and a lower age still wins.
- `latency`: the lowest frame-age p99 at the cameras' own fps. A window that processed
  fewer than KEEP_UP of the frames the sources delivered scores its 1/p99 times the
  share it kept up with (over KEEP_UP), so dropping frames never buys a lower age.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from appliance.tune.meter import Window

Kind = Literal["fps", "latency"]
KEEP_UP = 0.97  # processed / delivered: the cameras' own fps, less a window's edge frames
SLO_FRAME_INTERVALS = 2.0


@dataclass(frozen=True)
class Objective:
    kind: Kind
    slo_ms: float  # frame-age p99 the fps objective must stay under

    def score(self, w: Window) -> float:
        if w.frames == 0:
            return 0.0
        if self.kind == "fps":
            return w.fps * min(1.0, self.slo_ms / w.p99_ms)
        kept = w.fps / (KEEP_UP * w.offered_fps) if w.offered_fps > 0 else 1.0
        return 1000.0 / w.p99_ms * min(1.0, kept)

    def met(self, w: Window) -> bool:
        """The window meets the objective's constraint (SLO, or keeping up)."""
        if self.kind == "fps":
            return w.p99_ms <= self.slo_ms
        return w.offered_fps <= 0 or w.fps >= KEEP_UP * w.offered_fps

    def describe(self) -> str:
        if self.kind == "fps":
            return f"most processed fps with frame-age p99 under {self.slo_ms:g} ms"
        return f"lowest frame-age p99 while processing ≥ {KEEP_UP:.0%} of the cameras' frames"


def default_slo_ms(camera_fps: list[float]) -> float:
    """Two frame intervals of the slowest camera (ms); 1 s when no rate is known yet."""
    rates = [f for f in camera_fps if f > 0]
    return SLO_FRAME_INTERVALS * 1000.0 / min(rates) if rates else 1000.0
