"""WebRTC viewers in a process of their own, for bench/webrtc.py: N aiortc peers watch one
stream of an appliance over HTTP signalling on loopback; for each decoded frame, each
viewer records when it was decoded and when its last RTP packet (the marker) arrived
(wall time), and the clock camera's stamp read from its pixels. aiortc's jitter buffer
hands a frame to the decoder only when the next frame's first packet arrives (it ignores
the marker bit), so "decoded" includes one frame interval that a browser does not add;
the marker's arrival is taken by wrapping aiortc's packet handler (bench only).

    python bench/_webrtc_viewer.py URL TOKEN STREAM VIEWERS SECONDS OUT.json

Prints READY when every viewer has its first frame, then records for SECONDS.
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
_handle = RTCRtpReceiver._handle_rtp_packet


async def _timed(self: RTCRtpReceiver, packet: Any, arrival_time_ms: int) -> None:
    if packet.marker:
        origin = ORIGIN.setdefault(self, packet.timestamp)
        relative = (packet.timestamp - origin) & 0xFFFFFFFF
        COMPLETE.setdefault(self, {})[relative] = time.time()
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


async def viewer(url: str, token: str, stream: str, record: list[tuple[float, float, int]],
                 first: asyncio.Event, recording: asyncio.Event) -> RTCPeerConnection:  # fmt: skip
    pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))
    pc.addTransceiver("video", direction="recvonly")

    @pc.on("track")
    def on_track(track: Any) -> None:
        receiver = next(r for r in pc.getReceivers() if r.track is track)

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
    url, token, stream, count, seconds, out = sys.argv[1:7]
    asyncio.run(main(url, token, stream, int(count), float(seconds), out))
