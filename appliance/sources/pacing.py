"""Realtime playback of files: frames leave at their pts, like a camera's would.

The wall clock is anchored at the first frame of each playback (a looping file starts a
new playback), so a file is paced the same whether it starts at pts 0 or at 3600 s.
"""

from __future__ import annotations

import threading
import time

_MAX_LAG_S = 0.5  # a file decoded slower than realtime re-anchors instead of bursting


class Pacer:
    """Releases file frames at their pts like a camera: wall clock anchored at the first."""

    def __init__(self, stop: threading.Event, fps: float | None) -> None:
        self._stop = stop
        self._frame_s = 1.0 / fps if fps else 0.0  # for frames without pts
        self._count = 0
        self._anchor_mono = 0.0
        self._anchor_pts: float | None = None

    def wait(self, pts: float | None) -> bool:
        """Wait until the frame is due; False when stopped meanwhile."""
        t = pts if pts is not None else self._count * self._frame_s
        self._count += 1
        now = time.perf_counter()
        if self._anchor_pts is None:
            self._anchor_mono, self._anchor_pts = now, t
            return True
        delay = self._anchor_mono + (t - self._anchor_pts) - now
        if delay < -_MAX_LAG_S:
            self._anchor_mono, self._anchor_pts = now, t
        return delay <= 0 or not self._stop.wait(delay)
