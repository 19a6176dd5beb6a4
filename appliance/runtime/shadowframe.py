"""The newest frame a shadow compared, kept for the web viewer's side by side: the live
and the candidate result of one frame with the frame itself, so that an image and the two
overlays drawn on it are always of the same frame.

The frame is the captured one both workflows ran on (a reference, never a copy: frames are
shared read-only, shadow.py); a shadow keeps one such pair, replaced by each comparison.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from appliance.runtime.comparison import match
from pipelines.types import Detections, FrameResult, Image
from sinks.messages import prediction


@dataclass(frozen=True, slots=True)
class ComparedFrame:
    """One compared pair of results and the frame they were made from."""

    live: FrameResult
    candidate: FrameResult
    image: Image  # the frame as captured, before any block drew on it

    @classmethod
    def of(cls, live: FrameResult, candidate: FrameResult) -> ComparedFrame | None:
        """The pair with its captured frame; None when neither result holds it (a
        workflow run always does: WorkflowRun.run keeps it as `source_image`)."""
        for image in (candidate.source_image, live.source_image):
            if image is not None:
                return cls(live, candidate, image)
        return None

    def to_json(self, iou: float) -> dict[str, Any]:
        """Both results as sinks send them (docs/outputs.md), and per output of detections
        the live rows the candidate missed and its rows the live output lacked, matched as
        the comparison matches them (comparison.py) at IoU `iou`."""
        missed: dict[str, list[int]] = {}
        extra: dict[str, list[int]] = {}
        for name, value in self.live.outputs.items():
            other = self.candidate.outputs.get(name)
            if isinstance(value, Detections) and isinstance(other, Detections):
                found = match(value, other, iou)
                missed[name], extra[name] = found.missed, found.extra
        height, width = self.image.shape[:2]
        return {
            "stream": self.live.stream_id,
            "seq": self.live.seq,
            "width": int(width),
            "height": int(height),
            "iou": iou,
            "live": prediction(self.live),
            "candidate": prediction(self.candidate),
            "missed": missed,
            "extra": extra,
        }
