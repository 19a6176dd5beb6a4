"""One stream's newest result for its WebRTC viewers: the video frame scaled and
converted once per size and the predictions message encoded once, however many viewers
watch.

The stream's worker thread hands each result over in a few microseconds (a reference
and a wake-up of the event loop); everything else happens when a viewer asks, so a
stream nobody watches pays nothing and a slow viewer gets fewer frames, never older ones.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable

import cv2
import numpy as np

from appliance.runtime.runtime import Runtime
from pipelines.types import FrameResult
from sinks.messages import prediction

Entry = tuple[int, FrameResult]  # (the feed's own count, the result): a stream that
# restarts numbers its frames from 0 again, the feed's count only goes up.


class StreamFeed:
    def __init__(self, runtime: Runtime, stream_id: str, loop: asyncio.AbstractEventLoop) -> None:
        self.stream_id = stream_id
        self._loop = loop
        self._newest: Entry | None = None
        self._count = 0
        self._arrived = asyncio.Event()
        # The newest entry's images, by (width, raw), each converted once.
        self._images: dict[tuple[int | None, bool], asyncio.Future[np.ndarray]] = {}
        self._images_of = 0  # the count the cached images belong to
        self._message: tuple[int, str] | None = None
        # The stream draws while anyone watches it (appliance/runtime/video.py).
        self._release_video = runtime.hold_video(stream_id)
        self._unsubscribe: Callable[[], None] = runtime.subscribe(self._on_result, stream_id)

    def close(self) -> None:
        self._unsubscribe()
        self._release_video()

    def _on_result(self, result: FrameResult) -> None:
        """On the stream's worker thread: keep a reference, wake the loop. A result from
        before the stream heard of its first viewer has no image: not one to show."""
        if result.image is None:
            return
        self._count += 1  # this thread only
        self._newest = (self._count, result)
        self._loop.call_soon_threadsafe(self._arrived.set)

    async def newer_than(self, count: int) -> Entry:
        """The newest result once there is one newer than `count`."""
        while True:
            newest = self._newest
            if newest is not None and newest[0] > count:
                return newest
            # Cleared on the loop, set on the loop (call_soon_threadsafe): a result that
            # lands between the check above and the wait below still wakes it.
            self._arrived.clear()
            newest = self._newest
            if newest is not None and newest[0] > count:
                return newest
            await self._arrived.wait()

    async def image(self, entry: Entry, max_width: int | None, raw: bool = False) -> np.ndarray:
        """The entry's image (`raw`: the frame as captured, else the workflow's video
        output) as I420 (yuv420p), at most `max_width` wide: converted once per width in
        a worker thread, shared by every viewer that asks."""
        count, result = entry
        if count != self._images_of:
            self._images, self._images_of = {}, count
        future = self._images.get((max_width, raw))
        if future is None:
            future = self._images[(max_width, raw)] = asyncio.ensure_future(
                asyncio.to_thread(to_i420, source(result, raw), max_width)
            )
        return await asyncio.shield(future)

    def message(self, entry: Entry) -> str:
        """The entry's predictions as the JSON text the data channel sends (the schema
        of the MQTT and webhook sinks: sinks/messages.py), encoded once."""
        if self._message is None or self._message[0] != entry[0]:
            text = json.dumps(prediction(entry[1]), separators=(",", ":"))
            self._message = (entry[0], text)
        return self._message[1]


def source(result: FrameResult, raw: bool) -> np.ndarray:
    """The image a viewer asked for: the frame as captured (`raw`) or the video output."""
    if raw and result.source_image is not None:
        return result.source_image
    return result.drawn()  # the feed keeps only drawn results (_on_result)


def frame_message(entry: Entry, rtp_timestamp: int) -> str:
    """What the `frames` data channel says about one video frame sent: its RTP timestamp,
    which result it shows (`seq`, `capture_time`, as in the predictions) and the size of
    the image the predictions' coordinates refer to (before any scaling for the viewer)."""
    result = entry[1]
    height, width = result.drawn().shape[:2]
    doc = {
        "rtp_timestamp": rtp_timestamp,
        "seq": result.seq,
        "width": width,
        "height": height,
        "capture_time": round(result.capture_time, 6),
    }
    return json.dumps(doc, separators=(",", ":"))


def to_i420(image: np.ndarray, max_width: int | None) -> np.ndarray:
    """A BGR image scaled down to `max_width` (aspect kept) and converted to I420, whose
    planes need even sides (one odd row or column is dropped)."""
    height, width = image.shape[:2]
    if max_width is not None and width > max_width:
        scale = max_width / width
        width, height = max_width, max(2, round(height * scale))
        image = cv2.resize(image, (width, height), interpolation=cv2.INTER_AREA)
    even = image[: height - height % 2, : width - width % 2]
    return cv2.cvtColor(np.ascontiguousarray(even), cv2.COLOR_BGR2YUV_I420)
