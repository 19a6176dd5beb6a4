"""A viewer's video: the newest frame of its stream each time the encoder asks, at most
`max_fps`, stamped with the frame's capture time."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from fractions import Fraction

from aiortc import MediaStreamTrack
from av import VideoFrame

from appliance.server.webrtc.feed import StreamFeed

CLOCK_HZ = 90_000  # RTP's video clock (RFC 3551)
TIME_BASE = Fraction(1, CLOCK_HZ)


class NewestFrameTrack(MediaStreamTrack):
    kind = "video"

    def __init__(
        self, feed: StreamFeed, max_fps: float, max_width: int | None, on_sent: Callable[[], None]
    ) -> None:
        super().__init__()
        self._feed = feed
        self._interval = 1.0 / max_fps
        self._max_width = max_width
        self._on_sent = on_sent
        self._last = 0  # the feed count last sent
        self._due = 0.0  # loop time before which no frame goes out (max_fps)
        self._first_capture: float | None = None
        self._pts = -1

    async def recv(self) -> VideoFrame:
        loop = asyncio.get_running_loop()
        entry = await self._feed.newer_than(self._last)
        wait = self._due - loop.time()
        if wait > 0:
            await asyncio.sleep(wait)
            entry = await self._feed.newer_than(self._last)  # the newest after the wait
        self._due = loop.time() + self._interval
        self._last = entry[0]
        pixels = await self._feed.image(entry, self._max_width)
        frame = VideoFrame.from_ndarray(pixels, format="yuv420p")
        capture = entry[1].capture_mono
        if self._first_capture is None:
            self._first_capture = capture
        # Capture time on the RTP clock; never backwards (a restarted stream's clock).
        self._pts = max(self._pts + 1, round((capture - self._first_capture) * CLOCK_HZ))
        frame.pts, frame.time_base = self._pts, TIME_BASE
        self._on_sent()
        return frame
