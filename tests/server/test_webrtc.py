"""WebRTC viewers against a live appliance on loopback, with real aiortc peers: the
annotated video arrives and shows the annotation, predictions arrive in order on the
data channel, sessions end and free what they held, and bad offers and limits are
answered."""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
import threading
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from ipaddress import ip_address
from typing import Any

import aioice.ice
import numpy as np
import pytest
from aiortc import RTCConfiguration, RTCPeerConnection, RTCSessionDescription

from appliance.server.webrtc.ice import host_addresses_for
from pipelines.blocks._draw import PALETTE
from tests.server.conftest import TOKEN, LiveFactory, config_doc, demo_stream
from tests.server.live import LiveServer, wait_for

LINES_Y = (0.25, 0.5)  # the annotated lines across the frame, normalised
LINE_PX = 16  # thick enough to survive the encoder
WAIT_S = 20.0


def annotated_stream(stream_id: str) -> dict[str, Any]:
    """The demo stream with an annotation: two thick horizontal lines, each of a known
    colour (shapes take the palette from its end: grey, then brown)."""
    stream = demo_stream(stream_id)
    workflow = stream["workflow"]
    workflow["blocks"].append({
        "id": "drawn", "type": "annotate", "detections": "people", "thickness": LINE_PX,
        "lines": [{"name": "", "points": [[0.05, y], [0.95, y]]} for y in LINES_Y],
    })  # fmt: skip
    workflow["outputs"]["video"] = "drawn"
    return stream


@pytest.fixture(scope="module")
def rtc_server(module_server: LiveFactory) -> LiveServer:
    doc = config_doc(annotated_stream("cam"), demo_stream("door"), demo_stream("gone"))
    doc["webrtc"] = {"host_addresses": ["127.0.0.1"], "max_sessions": 3,
                     "max_sessions_per_stream": 2, "connect_timeout_s": 3,
                     "max_buffered_bytes": 1024}  # fmt: skip
    live = module_server(doc)
    wait_for(lambda: live.stream("cam")["frames_processed"] > 0, 30.0, "cam processing")
    return live


def metric(live: LiveServer, name: str, stream: str) -> float:
    value = live.runtime.metrics.registry.get_sample_value(name, {"stream": stream})
    return value or 0.0


def sessions(live: LiveServer, stream: str) -> float:
    return metric(live, "appliance_webrtc_sessions", stream)


async def offer(pc: RTCPeerConnection, predictions: bool = True) -> tuple[dict[str, str], Any]:
    """A non-trickle offer for video only, with the `predictions` channel (or none)."""
    pc.addTransceiver("video", direction="recvonly")
    channel = pc.createDataChannel("predictions") if predictions else None
    await pc.setLocalDescription(await pc.createOffer())  # aiortc gathers before returning
    return {"sdp": pc.localDescription.sdp, "type": "offer"}, channel


async def post(live: LiveServer, path: str, body: dict[str, Any]) -> Any:
    return await asyncio.to_thread(live.call, "POST", path, json_body=body)


@asynccontextmanager
async def viewer(live: LiveServer, stream: str, **options: Any) -> AsyncIterator[Any]:
    """A connected aiortc peer: (pc, answer JSON, video frames queue, messages list)."""
    pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))
    frames: asyncio.Queue[Any] = asyncio.Queue()
    messages: list[dict[str, Any]] = []
    pumps: list[asyncio.Task[None]] = []

    @pc.on("track")
    def on_track(track: Any) -> None:
        async def pump() -> None:
            while True:
                await frames.put(await track.recv())

        pumps.append(asyncio.ensure_future(pump()))

    body, channel = await offer(pc)
    channel.on("message", lambda text: messages.append(json.loads(text)))
    reply = await post(live, f"/v1/streams/{stream}/webrtc", {**body, **options})
    assert reply.status == 201, reply.body[:300]
    answer = reply.json()
    await pc.setRemoteDescription(RTCSessionDescription(answer["sdp"], answer["type"]))
    try:
        yield pc, answer, frames, messages
    finally:
        for task in pumps:
            task.cancel()
        await pc.close()


def line_colour(frame: Any, line_y: float) -> np.ndarray:
    """The mean BGR colour along an annotated line, away from its ends."""
    image = frame.to_ndarray(format="bgr24")
    h, w = image.shape[:2]
    y = round(line_y * h)
    band = image[y - 2 : y + 3, round(0.2 * w) : round(0.8 * w)]
    colour: np.ndarray = band.reshape(-1, 3).mean(axis=0)
    return colour


def test_video_shows_the_annotation_and_predictions_arrive_in_order(
    rtc_server: LiveServer,
) -> None:
    async def watch() -> tuple[list[Any], list[dict[str, Any]]]:
        async with viewer(rtc_server, "cam", max_width=320) as (_, answer, frames, messages):
            assert answer["type"] == "answer" and answer["session_id"]
            got = [await asyncio.wait_for(frames.get(), WAIT_S) for _ in range(5)]
            while len(messages) < 5:
                await asyncio.sleep(0.05)
            return got, list(messages)

    frames, messages = asyncio.run(asyncio.wait_for(watch(), 60))
    for frame in frames:
        assert frame.width == 320  # scaled down from the clip's 960 x 540
        assert frame.height == 180
        for i, line_y in enumerate(LINES_Y):
            colour = line_colour(frame, line_y)
            assert np.abs(colour - np.array(PALETTE[-1 - i])).max() < 40, (i, colour)
    seqs = [m["seq"] for m in messages]
    assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs)
    first = messages[0]
    assert first["stream"] == "cam" and "people" in first["outputs"]
    assert first["capture_time"] > 1.7e9  # epoch seconds
    wait_for(lambda: sessions(rtc_server, "cam") == 0, 10.0, "the session closed")


def test_sessions_end_on_delete_and_limits_answer_429(rtc_server: LiveServer) -> None:
    async def run() -> None:
        async with viewer(rtc_server, "cam") as (_, first, frames, _m):
            await asyncio.wait_for(frames.get(), WAIT_S)
            async with viewer(rtc_server, "cam"):
                assert sessions(rtc_server, "cam") == 2
                pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))
                body, _ = await offer(pc)
                refused = await post(rtc_server, "/v1/streams/cam/webrtc", body)
                await pc.close()
                assert refused.status == 429
                assert "webrtc.max_sessions_per_stream" in refused.error["message"]
            gone = await asyncio.to_thread(
                rtc_server.call, "DELETE", f"/v1/webrtc/{first['session_id']}"
            )
            assert gone.status == 204
            # The second viewer closed its own connection: the appliance sees it go, at
            # once from its DTLS close, or (that UDP packet dropped on a loaded host) when
            # ICE consent fails: aioice's 6 checks 5 s apart, so up to 40 s.
            await asyncio.to_thread(
                wait_for, lambda: sessions(rtc_server, "cam") == 0, 40.0, "sessions closed"
            )
            again = await asyncio.to_thread(
                rtc_server.call, "DELETE", f"/v1/webrtc/{first['session_id']}"
            )
            assert again.status == 404

    asyncio.run(asyncio.wait_for(run(), 60))


def test_bad_offers_are_refused_with_the_reason(rtc_server: LiveServer) -> None:
    garbage = rtc_server.call("POST", "/v1/streams/cam/webrtc",
                              json_body={"sdp": "v=0\r\nnonsense", "type": "offer"})  # fmt: skip
    assert garbage.status == 400 and "SDP" in garbage.error["message"]

    async def data_only() -> Any:
        pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))
        pc.createDataChannel("predictions")
        await pc.setLocalDescription(await pc.createOffer())
        reply = await post(rtc_server, "/v1/streams/cam/webrtc",
                           {"sdp": pc.localDescription.sdp, "type": "offer"})  # fmt: skip
        await pc.close()
        return reply

    no_video = asyncio.run(data_only())
    assert no_video.status == 400 and "no video" in no_video.error["message"]
    unknown = rtc_server.call("POST", "/v1/streams/nope/webrtc",
                              json_body={"sdp": "v=0", "type": "offer"})  # fmt: skip
    assert unknown.status == 404
    wrong_type = rtc_server.call("POST", "/v1/streams/cam/webrtc",
                                 json_body={"sdp": "v=0", "type": "answer"})  # fmt: skip
    assert wrong_type.status == 422
    no_token = rtc_server.call("POST", "/v1/streams/cam/webrtc", token=None,
                               json_body={"sdp": "v=0", "type": "offer"})  # fmt: skip
    assert no_token.status == 401
    assert sessions(rtc_server, "cam") == 0  # nothing left open by the failures


def test_a_peer_that_never_connects_is_closed(rtc_server: LiveServer) -> None:
    async def offer_and_vanish() -> None:
        pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))
        body, _ = await offer(pc)
        reply = await post(rtc_server, "/v1/streams/door/webrtc", body)
        assert reply.status == 201
        await pc.close()  # before the answer is applied: ICE never completes

    asyncio.run(offer_and_vanish())
    assert sessions(rtc_server, "door") == 1
    wait_for(lambda: sessions(rtc_server, "door") == 0, 10.0, "the session closed")


def test_a_removed_stream_ends_its_sessions(rtc_server: LiveServer) -> None:
    async def run() -> None:
        async with viewer(rtc_server, "gone") as (pc, _, frames, _m):
            await asyncio.wait_for(frames.get(), WAIT_S)
            assert sessions(rtc_server, "gone") == 1
            removed = await asyncio.to_thread(rtc_server.call, "DELETE", "/v1/streams/gone")
            assert removed.status == 200
            await asyncio.to_thread(
                wait_for, lambda: sessions(rtc_server, "gone") == 0, 10.0, "session closed"
            )
            for _ in range(100):  # the appliance closed it: the viewer sees it too
                if pc.connectionState == "closed":
                    break
                await asyncio.sleep(0.1)
            assert pc.connectionState == "closed"

    asyncio.run(asyncio.wait_for(run(), 60))


VANISHING_VIEWER = """
import asyncio, json, sys, urllib.request
import aioice.ice
from aiortc import RTCConfiguration, RTCPeerConnection, RTCSessionDescription
aioice.ice.get_host_addresses = lambda use_ipv4, use_ipv6: ["127.0.0.1"] if use_ipv4 else []
url, token, channel = sys.argv[1:4]

async def main():
    pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))
    pc.addTransceiver("video", direction="recvonly")
    if channel == "predictions":
        pc.createDataChannel("predictions")
    got = asyncio.Event()

    @pc.on("track")
    def on_track(track):
        async def pump():
            await track.recv()
            got.set()
        asyncio.ensure_future(pump())

    await pc.setLocalDescription(await pc.createOffer())
    body = json.dumps({"sdp": pc.localDescription.sdp, "type": "offer"}).encode()
    req = urllib.request.Request(url, body, method="POST", headers={
        "Content-Type": "application/json", "Authorization": "Bearer " + token})
    answer = json.loads(urllib.request.urlopen(req, timeout=30).read())
    await pc.setRemoteDescription(RTCSessionDescription(answer["sdp"], "answer"))
    await asyncio.wait_for(got.wait(), 20)
    print("WATCHING", flush=True)
    await asyncio.sleep(3600)  # killed here, without a word to the appliance

asyncio.run(main())
"""


@contextmanager
def viewer_process(live: LiveServer, stream: str, channel: str) -> Iterator[Any]:
    """VANISHING_VIEWER in a process of its own, watching `stream` (with the predictions
    channel if `channel` is "predictions"); killed without a word at the end."""
    url = f"{live.url}/v1/streams/{stream}/webrtc"
    proc = subprocess.Popen([sys.executable, "-c", VANISHING_VIEWER, url, TOKEN, channel],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip
    try:
        assert proc.stdout is not None and proc.stderr is not None
        line = proc.stdout.readline().strip()
        assert line == "WATCHING", proc.stderr.read()[-2000:]
        yield proc
    finally:
        proc.kill()
        proc.communicate(timeout=10)


def own_threads() -> set[str]:
    """Threads other than the event loops' default executors (a bounded pool that keeps
    idle workers: aiortc encodes there)."""
    return {t.name for t in threading.enumerate() if not t.name.startswith("asyncio_")}


def test_a_viewer_that_vanishes_is_closed_and_leaves_nothing(
    rtc_server: LiveServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A viewer killed mid-stream (no DTLS close, no DELETE): ICE consent checks fail
    (aioice: 6 in a row, ~5 s apart; 2, 0.5 s apart here, read by its loop each time)
    and the session is closed with what it held."""
    monkeypatch.setattr(aioice.ice, "CONSENT_INTERVAL", 0.5)
    monkeypatch.setattr(aioice.ice, "CONSENT_FAILURES", 2)
    threads = own_threads()
    tasks = rtc_server.call_in_loop(lambda: len(asyncio.all_tasks()))
    with viewer_process(rtc_server, "door", "-"):
        assert sessions(rtc_server, "door") == 1
    wait_for(lambda: sessions(rtc_server, "door") == 0, 60.0, "the vanished viewer closed")
    wait_for(lambda: own_threads() <= threads, 10.0, f"threads back to {threads}")
    # No session task left on the server's loop (the count includes the probe's own).
    wait_for(lambda: rtc_server.call_in_loop(lambda: len(asyncio.all_tasks())) <= tasks,
             10.0, "tasks back")  # fmt: skip


def test_a_viewer_that_stops_reading_gets_predictions_skipped(rtc_server: LiveServer) -> None:
    """A viewer whose process is frozen (SIGSTOP) acknowledges nothing: its data channel's
    buffer passes webrtc.max_buffered_bytes (1 KiB here) and predictions are skipped and
    counted instead of queued; the stream and the other viewers are not held up."""

    def skipped() -> float:
        return metric(rtc_server, "appliance_webrtc_datachannel_skipped_total", "door")

    before, frames = skipped(), rtc_server.stream("door")["frames_processed"]
    with viewer_process(rtc_server, "door", "predictions") as proc:
        proc.send_signal(signal.SIGSTOP)
        wait_for(lambda: skipped() > before, 20.0, "predictions skipped")
        later = rtc_server.stream("door")["frames_processed"]
        wait_for(lambda: rtc_server.stream("door")["frames_processed"] > later + 5, 10.0,
                 "the stream going on")  # fmt: skip
        assert later > frames
    for session_id in rtc_server.call_in_loop(lambda: webrtc_sessions(rtc_server)):
        rtc_server.call("DELETE", f"/v1/webrtc/{session_id}")
    wait_for(lambda: sessions(rtc_server, "door") == 0, 10.0, "sessions closed")


def webrtc_sessions(live: LiveServer) -> list[str]:
    """The ids of the server's open WebRTC sessions (read on its loop)."""
    from appliance.server.routes.webrtc import WEBRTC

    assert live.app is not None
    return live.app[WEBRTC].session_ids()


def host_candidates(sdp: str) -> set[str]:
    """The addresses of an SDP's host candidates (`a=candidate:... IP PORT typ host`)."""
    found = set()
    for line in sdp.splitlines():
        if line.startswith("a=candidate:"):
            fields = line.split()
            assert fields[7] == "host", line  # no STUN/TURN configured: nothing else
            found.add(fields[4])
    return found


def test_a_server_bound_to_loopback_offers_only_loopback(live_server: LiveFactory) -> None:
    """No `webrtc.host_addresses`: the bind address (127.0.0.1) is the only candidate,
    not every interface's address, and a viewer on loopback connects."""
    server = live_server(config_doc(demo_stream("cam")))
    wait_for(lambda: server.stream("cam")["frames_processed"] > 0, 30.0, "cam processing")

    async def watch() -> str:
        async with viewer(server, "cam") as (_, answer, frames, _m):
            await asyncio.wait_for(frames.get(), WAIT_S)
            return str(answer["sdp"])

    answer = asyncio.run(asyncio.wait_for(watch(), 60))
    assert host_candidates(answer) == {"127.0.0.1"}


@pytest.mark.parametrize(
    "configured, bind, offered",
    [([], "127.0.0.1", ["127.0.0.1"]), ([], "192.0.2.7", ["192.0.2.7"]), ([], "::1", ["::1"]),
     ([], "0.0.0.0", []), ([], "::", []), ([], "", []), ([], "appliance.local", []),
     ([], "localhost", ["127.0.0.1"]), ([], "LocalHost.", ["127.0.0.1"]),
     (["10.0.0.2"], "127.0.0.1", ["10.0.0.2"]), (["10.0.0.2"], "0.0.0.0", ["10.0.0.2"])],
)  # fmt: skip
def test_host_candidates_default_to_a_specific_bind_address(
    configured: list[str], bind: str, offered: list[str]
) -> None:
    """[] means aioice's rule: every interface's address but loopback."""
    addresses = [ip_address(a) for a in configured]
    assert host_addresses_for(addresses, bind) == [ip_address(a) for a in offered]
