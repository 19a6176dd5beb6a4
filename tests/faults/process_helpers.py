"""What the sink and process fault tests share: a cheap workflow, a stream's fps over a
while, and a webhook receiver that can be made slow at any moment."""

from __future__ import annotations

import asyncio
import time

from aiohttp import web

from appliance.runtime.streams import Stream
from tests.sinks.receiver import Receiver

FPS = 30  # the test clips' rate, played in real time like a camera
# Loose sanity bound: a fault elsewhere must not slow a stream. Measured ~1.0 (the figures);
# a busy 2-core machine moves one 1-2 s window's fps by up to ~20 % all by itself, and by
# up to half beside a second pytest worker and other load (0.514 in one such run). A
# stream the fault held up would fall far lower (to ~0 while it lasts), as in
# test_cameras.py's OTHERS_MIN_RATIO.
FPS_RATIO_MIN = 0.5
WAIT_S = 20.0  # generous waits for a busy 2-core machine; passing runs take far less
# Cheap frames: drawing on a copy of each frame needs no model.
DRAW = {"name": "draw", "blocks": [{"id": "drawn", "type": "annotate"}],
        "outputs": {"video": "drawn"}}  # fmt: skip


def fps_over(stream: Stream, seconds: float) -> float:
    """The stream's processed frames per second over the next `seconds`."""
    count, began = stream.rate.count, time.monotonic()
    time.sleep(seconds)
    return (stream.rate.count - count) / (time.monotonic() - began)


class SlowReceiver(Receiver):
    """A Receiver (tests/sinks/receiver.py) whose answers take `delay_s`, read when each
    request arrives and changed at any time: a slow endpoint, for as long as a test says."""

    delay_s = 0.0

    def __enter__(self) -> SlowReceiver:
        super().__enter__()
        return self

    async def _handle(self, request: web.Request) -> web.Response:
        delay = self.delay_s
        if delay:
            await asyncio.sleep(delay)
        return await super()._handle(request)
