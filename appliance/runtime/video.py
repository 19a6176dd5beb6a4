"""Who wants a stream's video: drawing (annotation, blur) happens only when someone does.

A stream's workflow draws its `video` output for viewers: WebRTC, the JPEG and MJPEG
routes, an MQTT snapshot, a recording. With nobody watching, that drawing is work for
nothing (on the demo's people counter, the largest share of a frame's Python after the
tracker: bench/results/gil_profile.json), so the worker runs the workflow without the
steps that only draw (pipelines/executor.py `video_only`) and the result carries no image.
A stream's drawing starts again on the first frame after someone asks.

Two ways to ask: `hold()` for as long as a reader lasts (a viewer, an MJPEG response, a
recording), and `lease(s)` for a one-off read (a JPEG snapshot) that then waits for a
drawn frame. `always` (a stream's `draw: always`, or a sink that sends images) never
stops drawing.

The worker reads `wanted` once per frame without a lock: an int and a float, each read
whole. A reader that starts between two reads gets its first drawn frame one frame later.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable


class VideoDemand:
    """One stream's readers of its video, kept across the stream's restarts."""

    def __init__(self) -> None:
        self._holders = 0
        self._until = 0.0  # time.perf_counter() until which a lease wants video
        self._lock = threading.Lock()  # holders change on the loop and on other threads

    def wanted(self, now: float) -> bool:
        """Whether a frame the worker runs at `now` (perf_counter, s) must be drawn."""
        return self._holders > 0 or now < self._until

    def hold(self) -> Callable[[], None]:
        """Want the video until the returned release is called (it may be called twice)."""
        with self._lock:
            self._holders += 1
        released = False

        def release() -> None:
            nonlocal released
            with self._lock:
                if not released:
                    released = True
                    self._holders -= 1

        return release

    def lease(self, seconds: float) -> None:
        """Want the video for the next `seconds` (a single read, then it lapses)."""
        until = time.perf_counter() + seconds
        with self._lock:
            self._until = max(self._until, until)


class VideoDemands:
    """Every stream's VideoDemand by id, made on first ask: a viewer may ask before the
    stream (re)starts, and a reload keeps who watches."""

    def __init__(self) -> None:
        self._by_stream: dict[str, VideoDemand] = {}
        self._lock = threading.Lock()

    def of(self, stream_id: str) -> VideoDemand:
        with self._lock:
            demand = self._by_stream.get(stream_id)
            if demand is None:
                demand = self._by_stream[stream_id] = VideoDemand()
            return demand
