"""A viewer's video: the newest frame of its stream each time the encoder asks, at most
`max_fps`, stamped with the frame's capture time; and, for each frame sent, the RTP
timestamp it goes out with, so that a viewer can tell which result a presented frame
shows (`requestVideoFrameCallback`'s `rtpTimestamp` in a browser)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from fractions import Fraction

from aiortc import MediaStreamTrack, RTCRtpSender
from av import VideoFrame

from appliance.server.webrtc.feed import Entry, StreamFeed

CLOCK_HZ = 90_000  # RTP's video clock (RFC 3551)
TIME_BASE = Fraction(1, CLOCK_HZ)
RTP_MASK = 0xFFFFFFFF  # RTP timestamps are 32 bits and wrap (RFC 3550, 5.1)
OnSent = Callable[[Entry, int | None], None]  # (the entry sent, its RTP timestamp or None)


class RtpClock:
    """The RTP timestamps a sender gives our frames: its origin plus each frame's pts.

    aiortc draws the origin at random when RTP starts and keeps it to itself; the sender
    does keep the timestamp of the last packet it sent. It encodes and sends one frame at
    a time, so when the track is asked for the next frame, every packet of the previous
    one has gone: that timestamp minus the previous pts is the origin. Taken once two
    frames in a row agree (an encoder that sent nothing for a frame gives a wrong one).
    """

    def __init__(self) -> None:
        self.sender: RTCRtpSender | None = None  # set by the session after addTrack
        self.origin: int | None = None
        self._candidate: int | None = None

    def learn(self, last_pts: int) -> None:
        if self.origin is not None or self.sender is None or last_pts < 0:
            return
        # aiortc 1.x keeps it in a private attribute; tests/server/test_webrtc.py checks
        # the timestamps against the packets a peer receives, so a change shows there.
        sent = getattr(self.sender, "_RTCRtpSender__rtp_timestamp", None)
        if not isinstance(sent, int) or sent == 0:  # 0: nothing sent yet
            return
        candidate = (sent - last_pts) & RTP_MASK
        if candidate == self._candidate:
            self.origin = candidate
        self._candidate = candidate

    def rtp(self, pts: int) -> int | None:
        return None if self.origin is None else (self.origin + pts) & RTP_MASK


class NewestFrameTrack(MediaStreamTrack):
    kind = "video"

    def __init__(
        self,
        feed: StreamFeed,
        max_fps: float,
        max_width: int | None,
        on_sent: OnSent,
        raw: bool = False,
    ) -> None:
        super().__init__()
        self._feed = feed
        self._interval = 1.0 / max_fps
        self._max_width = max_width
        self._raw = raw
        self._on_sent = on_sent
        self.clock = RtpClock()
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
        # From the previous due time, not from now: the loop's lag would add to every
        # period (4.5 fps for 5 on a busy machine); from now after a pause (no burst).
        now = loop.time()
        base = self._due if self._due > now - self._interval else now
        self._due = base + self._interval
        self._last = entry[0]
        pixels = await self._feed.image(entry, self._max_width, self._raw)
        frame = VideoFrame.from_ndarray(pixels, format="yuv420p")
        capture = entry[1].capture_mono
        if self._first_capture is None:
            self._first_capture = capture
        self.clock.learn(self._pts)  # the previous frame has gone out by now
        # Capture time on the RTP clock; never backwards (a restarted stream's clock).
        self._pts = max(self._pts + 1, round((capture - self._first_capture) * CLOCK_HZ))
        frame.pts, frame.time_base = self._pts, TIME_BASE
        self._on_sent(entry, self.clock.rtp(self._pts))
        return frame
