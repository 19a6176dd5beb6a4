"""Long-lived readers of one stream's results (server-sent events, MJPEG): what they wait
for, and when they end.

A reader may wait long for its stream's next result (a camera offline, a tiny
`max_fps`). aiohttp cancels a handler whose client left only with `handler_cancellation`
on (off by default; on, it would cut short every route's work), and otherwise only a write
finds out, so a reader that just waited for its next result would keep its watcher slot
(limits.max_watchers) for as long as nothing came, its stream removed or not. `follow`
waits in steps of `WATCH_S` and, between them, looks at the connection and the stream: a
reader ends within `WATCH_S` of its client leaving, its stream being removed (the removal
also wakes it at once) or the appliance stopping.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import AsyncIterator

from aiohttp import web

from appliance.observe.latest import Latest
from appliance.runtime.runtime import Runtime

WATCH_S = 0.5  # how soon a waiting reader notices that its client or its stream is gone


async def follow(
    request: web.Request,
    rt: Runtime,
    stream_id: str,
    *,
    idle_s: float = math.inf,
    interval_s: float = 0.0,
) -> AsyncIterator[Latest | None]:
    """The stream's results for one reader, the newest first: each result the reader
    keeps up with (what came meanwhile is skipped), at most one per `interval_s`, and None
    after `idle_s` without one (time for a heartbeat). Ends when the client has gone, the
    stream was removed or the appliance stops.

    A stream removed and added again under the same id (a reload that changed it) starts
    counting its results afresh: the reader follows the new one from its first result."""
    results = rt.latest
    newest = results.get(stream_id)
    seen = 0 if newest is None else newest.count - 1
    quiet_until = time.monotonic() + idle_s
    due = 0.0  # the frame rate cap: nothing before this time
    while _following(request, rt, stream_id):
        now = time.monotonic()
        if now < due:
            await asyncio.sleep(min(WATCH_S, due - now))
            continue
        newest = results.get(stream_id)
        if newest is None or newest.count < seen:
            seen = 0  # removed (and maybe added again): its count starts over
        latest = await results.wait_newer(
            stream_id, seen, min(WATCH_S, max(0.0, quiet_until - now))
        )
        if latest is not None:
            seen = latest.count
            yield latest
            now = time.monotonic()
            quiet_until, due = now + idle_s, now + interval_s
        elif time.monotonic() >= quiet_until:
            yield None
            quiet_until = time.monotonic() + idle_s


async def client_gone(request: web.Request) -> None:
    """Return once the client of `request` has gone (looked at every WATCH_S): for a
    handler that waits on something else, such as the gateway's copy of a worker's
    stream, to race against."""
    while _connected(request):
        await asyncio.sleep(WATCH_S)


def _following(request: web.Request, rt: Runtime, stream_id: str) -> bool:
    """Whether a reader should go on: its client is connected, its stream runs and the
    appliance does."""
    return _connected(request) and not rt.latest.closed and rt.has_stream(stream_id)


def _connected(request: web.Request) -> bool:
    transport = request.transport  # aiohttp drops it when the connection is lost
    return transport is not None and not transport.is_closing()
