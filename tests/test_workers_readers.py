"""Viewers of workers behind the gateway (`appliance serve --workers N --host H`):

- a worker listens on a Unix socket, yet the WebRTC host candidate it offers by default
  is H, the address viewers reach the appliance at, not the config's `server.host` nor
  every interface's address;
- a result reader (events, MJPEG) that leaves while nothing is due to it frees its
  worker's watcher slot: the gateway closes its side too, without waiting for data.
"""

from __future__ import annotations

import asyncio
import http.client
import json
from contextlib import closing
from pathlib import Path
from typing import Any

from aiortc import RTCConfiguration, RTCPeerConnection

from tests.server.test_webrtc import host_candidates
from tests.support.appliance import DEMO_CLIP, Served, detect_workflow, person_model, start_served
from tests.test_workers import request

TOKEN = "t-3f9a"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
OFFLINE = "rtsp://127.0.0.1:1/none"  # nothing listens there: a camera that never answers
LEFT_S = 10.0  # a reader that left frees its slot well before this


def test_workers_offer_the_supervisors_bind_address(tmp_path: Path) -> None:
    config = tmp_path / "config.yaml"
    doc: dict[str, Any] = {
        "server": {"host": "0.0.0.0", "token": TOKEN},  # the command line's --host wins
        "models": {"person": person_model()},
        "streams": [{"id": "cam", "source": {"url": str(DEMO_CLIP), "pace": "realtime"},
                     "workflow": detect_workflow()}],
    }  # fmt: skip
    config.write_text(json.dumps(doc))
    served = start_served(config, tmp_path, "--workers", "2", "--host", "127.0.0.1")
    try:
        served.wait_for(lambda: request(served, "GET", "/v1/streams/cam", None, AUTH)[0] == 200,
                        60, "cam in its worker")  # fmt: skip
        assert host_candidates(asyncio.run(answer_to_an_offer(served))) == {"127.0.0.1"}
    finally:
        served.stop()


async def answer_to_an_offer(served: Served) -> str:
    pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))
    try:
        pc.addTransceiver("video", direction="recvonly")
        await pc.setLocalDescription(await pc.createOffer())
        offer = {"sdp": pc.localDescription.sdp, "type": "offer"}
        status, answer = await asyncio.to_thread(
            request, served, "POST", "/v1/streams/cam/webrtc", offer, AUTH
        )
        assert status == 201, answer
        return str(answer["sdp"])
    finally:
        await pc.close()


def test_a_reader_that_leaves_frees_its_workers_slot(tmp_path: Path) -> None:
    config = tmp_path / "config.yaml"
    doc: dict[str, Any] = {
        "server": {"token": TOKEN},
        "limits": {"max_watchers": 1},
        "models": {"person": person_model()},
        "streams": [{"id": "gone", "source": {"url": OFFLINE, "open_timeout_s": 2},
                     "workflow": detect_workflow()}],
    }  # fmt: skip
    config.write_text(json.dumps(doc))
    served = start_served(config, tmp_path, "--workers", "2")
    try:
        served.wait_for(lambda: request(served, "GET", "/v1/streams/gone", None, AUTH)[0] == 200,
                        60, "gone in its worker")  # fmt: skip
        for route in ("events", "video.mjpeg", "events"):
            path = f"/v1/streams/gone/{route}"
            # Let in once the last reader's slot is free: it left while nothing was due.
            with closing(let_in(served, path)):
                assert reader_status(served, path) == 429  # the one slot is taken
    finally:
        served.stop()


def connect(served: Served, path: str) -> http.client.HTTPConnection:
    """A GET of `path` sent to the gateway, its answer not read yet."""
    host, port = served.url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=LEFT_S)
    conn.request("GET", path, headers=AUTH)
    return conn


def let_in(served: Served, path: str) -> http.client.HTTPConnection:
    """A reader whose answer has begun (200 and its headers), let in within LEFT_S."""
    readers: list[http.client.HTTPConnection] = []

    def try_once() -> bool:
        conn = connect(served, path)
        if conn.getresponse().status == 200:
            readers.append(conn)
            return True
        conn.close()
        return False

    served.wait_for(try_once, LEFT_S, f"a reader let in on {path}")
    return readers[0]


def reader_status(served: Served, path: str) -> int:
    """The status a new reader gets (it leaves at once)."""
    with closing(connect(served, path)) as conn:
        return conn.getresponse().status
