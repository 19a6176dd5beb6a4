"""WebRTC viewers in a process of their own, for bench/webrtc.py: N aiortc peers watch one
stream of an appliance over HTTP signalling on loopback.

- `decode` (the latency part): for each decoded frame, each viewer records when it was
  decoded and when its last RTP packet (the marker) arrived (wall time), and the clock
  camera's stamp read from its pixels. aiortc's jitter buffer hands a frame to the
  decoder only when the next frame's first packet arrives (it ignores the marker bit), so
  "decoded" includes one frame interval that a browser does not add; the marker's arrival
  is taken by wrapping aiortc's packet handler (bench only).
- `count` (the cost part): each viewer records only its marker packets' arrival times
  and hands no packet on, so it never decodes (nor asks for keyframes or bitrate): a
  viewer that costs this machine little more than reading its sockets, while the
  appliance encodes and sends to it exactly as to any viewer.

    python bench/_webrtc_viewer.py URL TOKEN STREAM VIEWERS SECONDS OUT.json [decode|count]

Prints READY when every viewer has its first frame (`count`: its first whole frame's
marker), then records for SECONDS.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import aioice.ice
from aiortc import RTCConfiguration, RTCPeerConnection, RTCSessionDescription
from aiortc.rtcrtpreceiver import RTCRtpReceiver

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.support.clock_camera import read_stamp

# Loopback only (../shared/TESTBED.md): aioice offers no loopback candidates by itself.
aioice.ice.get_host_addresses = lambda use_ipv4, use_ipv6: ["127.0.0.1"] if use_ipv4 else []

# Per receiver: a frame's RTP timestamp, counted from the first one (aiortc's decoded
# frames carry that as their pts) -> the wall time its marker packet arrived.
COMPLETE: dict[RTCRtpReceiver, dict[int, float]] = {}
ORIGIN: dict[RTCRtpReceiver, int] = {}
COUNT_ONLY = False  # `count`: markers recorded, no packet handed on (no decoding)
MARKERS: dict[RTCRtpReceiver, list[float]] = {}  # `count`: each marker's arrival
_handle = RTCRtpReceiver._handle_rtp_packet


async def _timed(self: RTCRtpReceiver, packet: Any, arrival_time_ms: int) -> None:
    if packet.marker:
        if COUNT_ONLY:
            MARKERS.setdefault(self, []).append(time.time())
            return
        origin = ORIGIN.setdefault(self, packet.timestamp)
        relative = (packet.timestamp - origin) & 0xFFFFFFFF
        COMPLETE.setdefault(self, {})[relative] = time.time()
    if not COUNT_ONLY:
        await _handle(self, packet, arrival_time_ms)


RTCRtpReceiver._handle_rtp_packet = _timed  # type: ignore[method-assign]


def post(url: str, token: str, body: dict[str, Any]) -> dict[str, Any]:
    request = urllib.request.Request(
        url, json.dumps(body).encode(), method="POST",
        headers={"Content-Type": "application/json", "Authorization": f"Bearer {token}"},
    )  # fmt: skip
    with urllib.request.urlopen(request, timeout=30) as reply:
        answer: dict[str, Any] = json.loads(reply.read())
        return answer


PUMPS: set[asyncio.Task[None]] = set()


async def count_markers(receiver: RTCRtpReceiver, record: list[tuple[float, float, int]],
                first: asyncio.Event, recording: asyncio.Event) -> None:  # fmt: skip
    """`count`: move the receiver's markers into `record` (arrival, arrival, -1) while
    recording; `first` once one has arrived."""
    while True:
        await asyncio.sleep(0.05)
        markers = MARKERS.get(receiver, [])
        if markers:
            first.set()
        MARKERS[receiver] = []
        if recording.is_set():
            record.extend((at, at, -1) for at in markers)


async def viewer(url: str, token: str, stream: str, record: list[tuple[float, float, int]],
                 first: asyncio.Event, recording: asyncio.Event) -> RTCPeerConnection:  # fmt: skip
    pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))
    pc.addTransceiver("video", direction="recvonly")

    @pc.on("track")
    def on_track(track: Any) -> None:
        receiver = next(r for r in pc.getReceivers() if r.track is track)
        if COUNT_ONLY:
            PUMPS.add(asyncio.ensure_future(count_markers(receiver, record, first, recording)))
            return

        async def pump() -> None:
            while True:
                frame = await track.recv()
                arrived = time.time()
                first.set()
                complete = COMPLETE.get(receiver, {}).pop(frame.pts, None)
                if complete is None:
                    continue  # its first packet's timing lost (the first frame)
                if recording.is_set():
                    stamp = read_stamp(frame.to_ndarray(format="bgr24"))
                    if stamp is not None:
                        record.append((arrived, complete, stamp))

        PUMPS.add(asyncio.ensure_future(pump()))

    await pc.setLocalDescription(await pc.createOffer())
    body = {"sdp": pc.localDescription.sdp, "type": "offer"}
    answer = await asyncio.to_thread(post, f"{url}/v1/streams/{stream}/webrtc", token, body)
    await pc.setRemoteDescription(RTCSessionDescription(answer["sdp"], "answer"))
    return pc


async def main(url: str, token: str, stream: str, count: int, seconds: float, out: str) -> None:
    records: list[list[tuple[float, float, int]]] = [[] for _ in range(count)]
    firsts = [asyncio.Event() for _ in range(count)]
    recording = asyncio.Event()
    pcs = [await viewer(url, token, stream, records[i], firsts[i], recording)
           for i in range(count)]  # fmt: skip
    await asyncio.wait_for(asyncio.gather(*(f.wait() for f in firsts)), 30)
    print("READY", flush=True)
    recording.set()
    await asyncio.sleep(seconds)
    recording.clear()
    for pc in pcs:
        await pc.close()
    Path(out).write_text(json.dumps(records))


if __name__ == "__main__":
    url, token, stream, viewers, seconds, out = sys.argv[1:7]
    COUNT_ONLY = sys.argv[7:8] == ["count"]
    asyncio.run(main(url, token, stream, int(viewers), float(seconds), out))
