"""A real aiortc viewer for tests: a receive-only peer and the frames it gets."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

from aiortc import RTCConfiguration, RTCPeerConnection


async def recvonly_offer() -> tuple[RTCPeerConnection, asyncio.Queue[Any], dict[str, str]]:
    """A peer (no ICE server: loopback host candidates only, TESTBED.md) that receives
    video, the queue its decoded frames go to, and its offer as the API takes it. The
    caller closes the peer."""
    pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))
    frames: asyncio.Queue[Any] = asyncio.Queue()
    pc.on("track", lambda track: asyncio.ensure_future(pump(track, frames)))
    pc.addTransceiver("video", direction="recvonly")
    await pc.setLocalDescription(await pc.createOffer())
    return pc, frames, {"sdp": pc.localDescription.sdp, "type": "offer"}


async def pump(track: Any, frames: asyncio.Queue[Any]) -> None:
    """Every frame of `track` into `frames`, until the peer closes."""
    with contextlib.suppress(Exception):  # MediaStreamError when the peer closes
        while True:
            await frames.put(await track.recv())
