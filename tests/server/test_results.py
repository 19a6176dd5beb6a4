"""A stream's results over HTTP on a live server: the newest result, a JPEG snapshot at
the stream's frame size, server-sent events in order (a slow reader skips, the stream
goes on), MJPEG, and the bound on readers: a reader that leaves, or whose stream is
removed, frees its slot at once, even while nothing is due to it."""

from __future__ import annotations

import http.client
import json
import socket
import threading
from collections.abc import Iterator
from contextlib import closing, contextmanager
from typing import Any

import av
import cv2
import numpy as np
import pytest

from appliance.server.context import WATCHERS
from tests.server.conftest import TOKEN, WAIT_S, LiveFactory, config_doc, demo_stream
from tests.server.live import LiveServer, wait_for
from tests.support.appliance import DEMO_CLIP, detect_workflow


def clip_size() -> tuple[int, int]:
    with av.open(str(DEMO_CLIP)) as container:
        stream = container.streams.video[0]
        return int(stream.width), int(stream.height)


@contextmanager
def reading(
    server: LiveServer, path: str, receive_buffer: int | None = None
) -> Iterator[http.client.HTTPResponse]:
    """A GET whose answer is read as it comes; `receive_buffer` shrinks the client's
    socket buffer (bytes), as a reader on a slow link has."""
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=WAIT_S)
    if receive_buffer is not None:
        conn.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        conn.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, receive_buffer)
        conn.sock.settimeout(WAIT_S)
        conn.sock.connect(("127.0.0.1", server.port))
    conn.request("GET", path, headers={"Authorization": f"Bearer {TOKEN}"})
    try:
        yield conn.getresponse()
    finally:
        conn.close()


def next_event(resp: http.client.HTTPResponse) -> dict[str, Any]:
    """The next `result` event's data (comments and other lines skipped)."""
    while True:
        line = resp.readline().decode()
        assert line, "the event stream ended"
        if line.startswith("data: "):
            return dict(json.loads(line[6:]))


def test_the_newest_result_as_json(cam_server: LiveServer) -> None:
    first = cam_server.get_json("/v1/streams/cam/latest")
    assert first["stream"] == "cam" and first["v"] == 1
    assert set(first["outputs"]) == {"people"}
    wait_for(lambda: cam_server.get_json("/v1/streams/cam/latest")["seq"] > first["seq"],
             WAIT_S, "a newer result")  # fmt: skip
    missing = cam_server.call("GET", "/v1/streams/nope/latest")
    assert (missing.status, missing.error["code"]) == (404, "not_found")


def test_a_snapshot_is_a_jpeg_at_the_streams_frame_size(cam_server: LiveServer) -> None:
    reply = cam_server.call("GET", "/v1/streams/cam/snapshot.jpg")
    assert reply.status == 200 and reply.headers["content-type"] == "image/jpeg"
    image = cv2.imdecode(np.frombuffer(reply.body, np.uint8), cv2.IMREAD_COLOR)
    assert image is not None
    assert (image.shape[1], image.shape[0]) == clip_size()


def test_events_arrive_in_order_and_a_slow_reader_skips(cam_server: LiveServer) -> None:
    stream = cam_server.runtime.streams["cam"]
    with reading(cam_server, "/v1/streams/cam/events") as fast, \
         reading(cam_server, "/v1/streams/cam/events", receive_buffer=2048) as slow:  # fmt: skip
        assert fast.status == 200 and fast.headers["content-type"] == "text/event-stream"
        first_slow = next_event(slow)
        assert first_slow["skipped"] == 0  # it just came: it missed nothing
        # 150 results, 10 s at 15 fps: far more than the slow reader's few KB of buffers.
        events = [next_event(fast) for _ in range(150)]
        seqs = [e["seq"] for e in events]
        assert seqs == sorted(seqs) and len(set(seqs)) == 150
        assert {e["stream"] for e in events} == {"cam"}
        assert sum(e["skipped"] for e in events) <= 50  # the fast one gets most of them
        # The slow reader read nothing meanwhile: only what the socket buffers hold (a few
        # KB) waited for it, then its stream skipped to the newest result.
        backlog: list[dict[str, Any]] = []
        while not backlog or backlog[-1]["seq"] < events[-1]["seq"]:
            backlog.append(next_event(slow))
        assert backlog[0]["seq"] > first_slow["seq"]
        assert sum(e["skipped"] for e in backlog) >= 30
        assert len(backlog) < 120  # of the 150 results since: the rest were never queued
        processed = stream.rate.count
    wait_for(lambda: stream.rate.count > processed + 5, WAIT_S, "the stream goes on")


def test_mjpeg_parts_decode_to_frames(cam_server: LiveServer) -> None:
    with reading(cam_server, "/v1/streams/cam/video.mjpeg?max_fps=5") as resp:
        assert resp.status == 200
        assert resp.headers["content-type"] == "multipart/x-mixed-replace; boundary=frame"
        assert resp.readline() == b"--frame\r\n"
        headers = {}
        while (line := resp.readline()) != b"\r\n":
            name, _, value = line.decode().partition(":")
            headers[name.lower()] = value.strip()
        assert headers["content-type"] == "image/jpeg"
        jpeg = resp.read(int(headers["content-length"]))
        image = cv2.imdecode(np.frombuffer(jpeg, np.uint8), cv2.IMREAD_COLOR)
        assert image is not None and (image.shape[1], image.shape[0]) == clip_size()
    bad = cam_server.call("GET", "/v1/streams/cam/video.mjpeg?max_fps=500")
    assert bad.status == 422 and "max_fps" in bad.error["details"][0]


def test_readers_beyond_the_limit_get_429(live_server: LiveFactory) -> None:
    server = live_server({**config_doc(demo_stream("cam")), "limits": {"max_watchers": 1}})
    wait_for(lambda: server.stream("cam")["frames_processed"] > 0, WAIT_S, "cam processing")
    with reading(server, "/v1/streams/cam/events") as first:
        assert first.status == 200
        next_event(first)
        second = server.call("GET", "/v1/streams/cam/events")
        assert second.status == 429 and second.headers["retry-after"] == "1"
        assert "limits.max_watchers = 1" in second.error["message"]

    # The first reader left: the slot is free again (the server notices on its next write).
    def free() -> bool:
        with reading(server, "/v1/streams/cam/events") as again:
            return again.status == 200

    wait_for(free, WAIT_S, "the slot to be free")


def test_event_streams_end_when_the_appliance_stops(live_server: LiveFactory) -> None:
    server = live_server(config_doc(demo_stream("cam")))
    wait_for(lambda: server.stream("cam")["frames_processed"] > 0, WAIT_S, "cam processing")
    ended = threading.Event()
    with reading(server, "/v1/streams/cam/events") as resp:
        next_event(resp)

        def drain() -> None:
            while resp.readline():
                pass
            ended.set()

        reader = threading.Thread(target=drain, name="sse-reader", daemon=True)
        reader.start()
        assert server.stop()
        assert ended.wait(WAIT_S)


OFFLINE = "rtsp://127.0.0.1:1/none"  # nothing listens there: a camera that never answers
LEFT_S = 8.0  # a reader that left frees its slot well before this (SSE's heartbeat: 15 s)


def offline_stream(stream_id: str) -> dict[str, Any]:
    return {"id": stream_id, "source": {"url": OFFLINE, "open_timeout_s": 2},
            "workflow": detect_workflow()}  # fmt: skip


@pytest.fixture(scope="module")
def idle_server(module_server: LiveFactory) -> LiveServer:
    """`cam` (the clip, live) and `gone` (a camera that never answers), two readers at most."""
    doc = config_doc(demo_stream("cam"), offline_stream("gone"))
    server = module_server({**doc, "limits": {"max_watchers": 2}})
    wait_for(lambda: server.stream("cam")["frames_processed"] > 0, WAIT_S, "cam processing")
    return server


def watching(server: LiveServer) -> int:
    app = server.app
    assert app is not None
    return server.call_in_loop(lambda: app[WATCHERS].active)


def open_reader(server: LiveServer, path: str) -> tuple[http.client.HTTPConnection, Any]:
    """A reader whose answer has begun (200, headers read), with LEFT_S to read it."""
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=LEFT_S)
    conn.request("GET", path, headers={"Authorization": f"Bearer {TOKEN}"})
    resp = conn.getresponse()
    assert resp.status == 200, (path, resp.status, resp.read()[:300])
    return conn, resp


def read_part(resp: http.client.HTTPResponse) -> bytes:
    """The next MJPEG part's JPEG."""
    assert resp.readline() == b"--frame\r\n"
    headers = {}
    while (line := resp.readline()) != b"\r\n":
        name, _, value = line.decode().partition(":")
        headers[name.lower()] = value.strip()
    return resp.read(int(headers["content-length"]))


@pytest.mark.parametrize(
    "path",
    ["/v1/streams/gone/events", "/v1/streams/gone/video.mjpeg",
     "/v1/streams/cam/video.mjpeg?max_fps=0.01"],  # one frame, then the next in 100 s
    ids=["events-offline", "mjpeg-offline", "mjpeg-tiny-fps"],
)  # fmt: skip
def test_readers_that_leave_while_nothing_is_due_free_their_slots(
    idle_server: LiveServer, path: str
) -> None:
    for _ in range(2):  # twice: the slots freed the first time are usable again
        readers = [open_reader(idle_server, path) for _ in range(2)]
        if "max_fps" in path:
            for _conn, resp in readers:
                assert read_part(resp)  # the first frame came; the next is not due
        assert watching(idle_server) == 2
        assert idle_server.call("GET", path).status == 429  # the limit is really there
        for conn, _resp in readers:
            conn.close()  # the client leaves while its stream has nothing to send
        wait_for(lambda: watching(idle_server) == 0, LEFT_S, "the readers' slots to be free")


def test_removing_a_stream_ends_its_readers(idle_server: LiveServer) -> None:
    added = idle_server.call("POST", "/v1/streams", json_body=offline_stream("doomed"))
    assert added.status == 201, added.body
    readers = [open_reader(idle_server, f"/v1/streams/doomed/{route}")
               for route in ("events", "video.mjpeg")]  # fmt: skip
    assert watching(idle_server) == 2
    assert idle_server.call("DELETE", "/v1/streams/doomed").status == 200
    for conn, resp in readers:
        with closing(conn):
            assert resp.read() == b""  # the answer ended (a timeout: it went on)
    assert watching(idle_server) == 0
