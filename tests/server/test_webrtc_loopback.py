"""`appliance serve` bound to 127.0.0.1 with no `webrtc.host_addresses` (configs/demo.yaml):
a real aiortc viewer gets loopback host candidates only, not the machine's other
addresses, and connects; and aioice's INFO chatter stays out of `serve`'s log unless it
runs at DEBUG."""

from __future__ import annotations

import asyncio
import json
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aioice.ice
import pytest
from aiortc import RTCConfiguration, RTCPeerConnection, RTCSessionDescription

from tests.server.test_webrtc import host_candidates
from tests.support.appliance import DEMO_CLIP, Served

FRAMES_ONLY = {"name": "frames", "blocks": [], "outputs": {"video": "frame"}}
WAIT_S = 20.0


def post_offer(served: Served, sdp: str) -> dict[str, Any]:
    body = json.dumps({"sdp": sdp, "type": "offer"}).encode()
    request = urllib.request.Request(
        f"{served.url}/v1/streams/cam/webrtc",
        body,
        method="POST",
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=WAIT_S) as response:
        answer: dict[str, Any] = json.loads(response.read())
    return answer


async def watch(served: Served) -> str:
    """Connect a viewer (no ICE servers, as the viewer page's default), take one video
    frame; the answer's SDP."""
    pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))
    frames: asyncio.Queue[Any] = asyncio.Queue()
    pumps: list[asyncio.Task[None]] = []

    @pc.on("track")
    def on_track(track: Any) -> None:
        async def pump() -> None:
            await frames.put(await track.recv())

        pumps.append(asyncio.ensure_future(pump()))

    try:
        pc.addTransceiver("video", direction="recvonly")
        await pc.setLocalDescription(await pc.createOffer())
        answer = await asyncio.to_thread(post_offer, served, pc.localDescription.sdp)
        await pc.setRemoteDescription(RTCSessionDescription(answer["sdp"], answer["type"]))
        await asyncio.wait_for(frames.get(), WAIT_S)
        assert pc.connectionState == "connected"
        return str(answer["sdp"])
    finally:
        for task in pumps:
            task.cancel()
        await pc.close()


@pytest.mark.parametrize("log_level", ["INFO", "DEBUG"])
def test_a_loopback_server_offers_loopback_and_keeps_aioice_quiet(
    log_level: str,
    write_config: Callable[[dict[str, Any]], Path],
    serve: Callable[..., Served],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """INFO is `serve`'s default level: no aioice record reaches its log, although every
    connection makes aioice log its checks at INFO; at DEBUG they are there."""
    # The viewer's side: aioice offers no loopback address of its own (TESTBED.md).
    monkeypatch.setattr(aioice.ice, "get_host_addresses", lambda use_ipv4, use_ipv6: ["127.0.0.1"])
    source = {"url": str(DEMO_CLIP), "loop": True, "pace": "realtime"}
    config = write_config({
        "server": {"host": "127.0.0.1"},  # and no `webrtc:` section, as configs/demo.yaml
        "streams": [{"id": "cam", "source": source, "workflow": FRAMES_ONLY}],
    })  # fmt: skip
    served = serve(config, "--log-level", log_level)

    answer = asyncio.run(asyncio.wait_for(watch(served), 60))

    assert host_candidates(answer) == {"127.0.0.1"}, answer
    log = served.log_path.read_text(encoding="utf-8", errors="replace")  # all of it
    aioice_lines = [line for line in log.splitlines() if " aioice." in line]
    if log_level == "INFO":
        assert aioice_lines == []
    else:
        assert any(" INFO " in line for line in aioice_lines), log[-2000:]
