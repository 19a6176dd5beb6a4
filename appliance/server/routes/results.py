"""A stream's results over HTTP, for programs that just want to read them: the newest
result as JSON, its `video` output as a JPEG, every result as server-sent events, and the
video as MJPEG. All read the runtime's newest-result store (appliance/observe/latest.py): a slow
reader skips results, it never makes the appliance buffer for it.
"""

from __future__ import annotations

import contextlib
import json
import logging
import re
import socket
import time
from collections.abc import Iterator
from typing import Any

from aiohttp import web

from appliance.errors import NoResultError, UnknownStreamError
from appliance.observe.latest import Latest
from appliance.policy.roles import Role
from appliance.runtime.runtime import Runtime
from appliance.server.context import WATCHERS, in_thread, runtime_of
from appliance.server.errors import InvalidError
from appliance.server.readers import follow
from appliance.server.routing import Fanout, Reply, Route
from appliance.server.schemas import LatestResult
from pipelines.types import Image
from sinks.messages import encode_jpeg, prediction

SEND_BUFFER_BYTES = 4096  # per reader (the kernel doubles it): about 20 events
HEARTBEAT_S = 15.0  # an SSE comment this often keeps proxies from closing an idle stream
JPEG_QUALITY = 80  # OpenCV's default is 95: a fifth of the bytes for a preview
MJPEG_BOUNDARY = "frame"
MJPEG_TYPE = f"multipart/x-mixed-replace; boundary={MJPEG_BOUNDARY}"
MAX_MJPEG_FPS = 30.0
# A snapshot asks the stream to draw for this long (appliance/runtime/video.py), so a
# page polling it every few seconds finds a drawn frame ready; and waits at most this
# long for one (a stream at 1 fps draws its next frame within a second).
SNAPSHOT_LEASE_S = 10.0
SNAPSHOT_WAIT_S = 5.0
# `max_fps` as a plain decimal: float() also takes "5\n", "1e1", "nan" and other scripts'
# digits ("٥" is 5).
_DECIMAL = re.compile(r"[0-9]{1,6}(?:\.[0-9]{1,6})?")

log = logging.getLogger("appliance.server")


def _stream_id(request: web.Request) -> str:
    stream_id = request.match_info["id"]
    if not runtime_of(request).has_stream(stream_id):
        raise UnknownStreamError(stream_id)
    return stream_id


def _newest(rt: Runtime, stream_id: str) -> Latest:
    latest = rt.latest.get(stream_id)
    if latest is None:
        raise NoResultError(stream_id)
    return latest


def _count(request: web.Request, kind: str) -> None:
    runtime_of(request).metrics.result_reads.labels(kind).inc()


async def latest_result(request: web.Request) -> web.Response:
    """The stream's newest result: its outputs as JSON (404 before its first result)."""
    stream_id = _stream_id(request)
    _count(request, "latest")
    return web.json_response(prediction(_newest(runtime_of(request), stream_id).result))


async def snapshot(request: web.Request) -> web.Response:
    """The newest frame of the stream's `video` output (the frame itself without one) as
    a JPEG, at the stream's frame size."""
    stream_id = _stream_id(request)
    rt = runtime_of(request)
    latest = _newest(rt, stream_id)
    _count(request, "snapshot")
    image = latest.result.image
    if image is None:  # nobody was watching: ask for drawing, take the first drawn frame
        rt.lease_video(stream_id, SNAPSHOT_LEASE_S)
        image = await _drawn(rt, stream_id, latest.count)
    body = await in_thread(encode_jpeg, image, JPEG_QUALITY)
    return web.Response(body=body, content_type="image/jpeg")


async def _drawn(rt: Runtime, stream_id: str, count: int) -> Image:
    """The first drawn frame after result `count`; NoResultError after SNAPSHOT_WAIT_S."""
    deadline = time.monotonic() + SNAPSHOT_WAIT_S
    while (left := deadline - time.monotonic()) > 0:
        latest = await rt.latest.wait_newer(stream_id, count, left)
        if latest is None:
            break
        if latest.result.image is not None:
            return latest.result.image
        count = latest.count
    raise NoResultError(stream_id)


async def result_events(request: web.Request) -> web.StreamResponse:
    """Server-sent events: one `result` event per result the reader keeps up with (a slow
    reader gets the newest and skips the rest: `skipped` says how many), a comment every
    15 s while the stream is idle. Ends when the client leaves, the stream is removed or
    the appliance stops (readers.py)."""
    stream_id = _stream_id(request)
    rt = runtime_of(request)
    with request.app[WATCHERS].slot():
        _count(request, "events")
        response = web.StreamResponse(
            headers={"Content-Type": "text/event-stream", "Cache-Control": "no-store"}
        )
        await response.prepare(request)
        _small_buffers(request)
        with _until_the_client_leaves(request):
            await _send_events(request, response, rt, stream_id)
        return response


async def _send_events(
    request: web.Request, response: web.StreamResponse, rt: Runtime, stream_id: str
) -> None:
    # The first event is the newest result, with nothing skipped: a reader that just
    # came missed nothing.
    last: int | None = None
    async for latest in follow(request, rt, stream_id, idle_s=HEARTBEAT_S):
        if latest is None:
            await response.write(b": idle\n\n")
            continue
        skipped = 0 if last is None else max(0, latest.count - last - 1)
        last = latest.count
        message = {**prediction(latest.result), "skipped": skipped}
        data = json.dumps(message, separators=(",", ":"))
        await response.write(f"event: result\nid: {last}\ndata: {data}\n\n".encode())
        # aiohttp waits for the socket only every 64 KiB written; a reader that fell
        # behind must hold us here at once, so we skip to the newest result meanwhile.
        await request.writer.drain()


async def video_mjpeg(request: web.Request) -> web.StreamResponse:
    """The `video` output as MJPEG (multipart/x-mixed-replace), at most `max_fps` frames
    per second (default 10): for a browser `<img>` or VLC, no WebRTC needed. Ends as the
    event stream does."""
    stream_id = _stream_id(request)
    interval = 1.0 / _max_fps(request)
    rt = runtime_of(request)
    with request.app[WATCHERS].slot():
        _count(request, "mjpeg")
        headers = {"Content-Type": MJPEG_TYPE, "Cache-Control": "no-store"}
        response = web.StreamResponse(headers=headers)
        await response.prepare(request)
        _small_buffers(request)
        release = rt.hold_video(stream_id)  # the stream draws while this reader lasts
        try:
            with _until_the_client_leaves(request):
                await _send_frames(request, response, rt, stream_id, interval)
        finally:
            release()
        return response


async def _send_frames(
    request: web.Request,
    response: web.StreamResponse,
    rt: Runtime,
    stream_id: str,
    interval: float,
) -> None:
    # `interval` is the frame rate cap: results in between are skipped.
    async for latest in follow(request, rt, stream_id, interval_s=interval):
        if latest is None or latest.result.image is None:
            continue  # a frame from before the reader's hold was not drawn
        jpeg = await in_thread(encode_jpeg, latest.result.image, JPEG_QUALITY)
        head = f"--{MJPEG_BOUNDARY}\r\nContent-Type: image/jpeg\r\n"
        await response.write(f"{head}Content-Length: {len(jpeg)}\r\n\r\n".encode() + jpeg)
        await response.write(b"\r\n")
        await request.writer.drain()  # as for events: a slow reader skips frames


@contextlib.contextmanager
def _until_the_client_leaves(request: web.Request) -> Iterator[None]:
    """A reader that goes away ends its answer, and that is no error: a DEBUG line, so
    that dropping readers cannot fill the log. A write then raises ConnectionResetError,
    or a plain ConnectionError ("Connection lost") while it waits for the socket."""
    try:
        yield
    except ConnectionError as exc:
        log.debug("%s %s: the client left (%s)", request.method, request.path, exc)


def _small_buffers(request: web.Request) -> None:
    """Keep little in flight to a reader, so one that falls behind makes our writes wait
    (and skip to the newest result) within a few KB, instead of the kernel queueing up
    to megabytes of stale results for it (Linux autotunes a send buffer up to 4 MB)."""
    transport = request.transport
    if transport is None:
        return
    sock = transport.get_extra_info("socket")
    if sock is not None:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SEND_BUFFER_BYTES)
    transport.set_write_buffer_limits(high=SEND_BUFFER_BYTES)


def _max_fps(request: web.Request) -> float:
    text = request.query.get("max_fps", "10")
    fps = float(text) if _DECIMAL.fullmatch(text) else -1.0
    if not 0 < fps <= MAX_MJPEG_FPS:
        raise InvalidError("invalid query", [f"max_fps: a number in (0, {MAX_MJPEG_FPS:g}]"])
    return fps


SSE: dict[str, Any] = {"type": "string", "description": "text/event-stream: `event: result`"}
MJPEG: dict[str, Any] = {"type": "string", "format": "binary"}
ROUTES = (
    Route(
        "GET",
        "/v1/streams/{id}/latest",
        latest_result,
        "The newest result",
        (Reply(200, "the newest result's outputs", LatestResult),),
        tag="results",
        role=Role.VIEWER,
        workers=Fanout.OWNER,
    ),
    Route(
        "GET",
        "/v1/streams/{id}/snapshot.jpg",
        snapshot,
        "The newest frame as JPEG",
        (Reply(200, "a JPEG image", MJPEG, "image/jpeg"),),
        tag="results",
        role=Role.VIEWER,
        workers=Fanout.OWNER,
    ),
    Route(
        "GET",
        "/v1/streams/{id}/events",
        result_events,
        "Results as server-sent events",
        (Reply(200, "an event stream", SSE, "text/event-stream"),),
        errors=(429,),
        tag="results",
        streaming=True,
        role=Role.VIEWER,
        workers=Fanout.OWNER,
    ),
    Route(
        "GET",
        "/v1/streams/{id}/video.mjpeg",
        video_mjpeg,
        "The video as MJPEG",
        (Reply(200, "an MJPEG stream", MJPEG, MJPEG_TYPE),),
        errors=(422, 429),
        tag="results",
        streaming=True,
        role=Role.VIEWER,
        workers=Fanout.OWNER,
    ),
)
