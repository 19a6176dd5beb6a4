"""WebRTC sessions: one peer connection per viewer, answering the viewer's offer with the
stream's newest annotated frames and, on a `predictions` data channel the viewer opens,
each result's predictions.

Limits (`webrtc.max_sessions`, `webrtc.max_sessions_per_stream`) are answered with 429.
A session ends when the viewer closes it (DELETE, or its peer connection), when its
connection fails (ICE consent lost: a viewer gone without a word), when it has not
connected within `webrtc.connect_timeout_s`, when its stream is removed, or at shutdown;
each end frees its track, its tasks and, with its stream's last viewer, the feed.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from collections.abc import Coroutine
from dataclasses import dataclass, field
from typing import Any

from aiortc import RTCDataChannel, RTCPeerConnection, RTCSessionDescription

from appliance.errors import LimitError, UnknownStreamError
from appliance.runtime.runtime import Runtime
from appliance.server.webrtc.config import WebRtcConfig
from appliance.server.webrtc.feed import Entry, StreamFeed, frame_message
from appliance.server.webrtc.ice import (
    host_addresses_for,
    offer_host_addresses,
    rtc_configuration,
)
from appliance.server.webrtc.track import NewestFrameTrack

log = logging.getLogger("appliance.webrtc")
CHANNEL = "predictions"  # the data channel label a viewer opens to get predictions
FRAMES = "frames"  # ... and the one to learn which result each video frame shows
RETRY_AFTER_S = 5
SWEEP_S = 2.0  # how often sessions of streams that went away (removed, reloaded) are closed


class OfferError(ValueError):
    """An SDP offer that cannot be answered; the message says why."""


@dataclass
class Session:
    id: str
    stream_id: str
    pc: RTCPeerConnection
    track: NewestFrameTrack | None = None
    frames: RTCDataChannel | None = None  # the viewer's `frames` channel, if it opened one
    tasks: set[asyncio.Task[None]] = field(default_factory=set)
    closed: bool = False


@dataclass
class _Shared:
    feed: StreamFeed
    viewers: int = 0


class WebRtcSessions:
    """Every WebRTC session of one appliance; on the server's event loop only."""

    def __init__(
        self, runtime: Runtime, config: WebRtcConfig, bind_host: str | None = None
    ) -> None:
        """`bind_host`: the address the server listens on, offered as the host candidate
        when `config.host_addresses` is empty and it is a single address (ice.py)."""
        self._runtime = runtime
        self._config = config
        self._sessions: dict[str, Session] = {}
        self._feeds: dict[str, _Shared] = {}
        metrics = runtime.metrics
        self._gauge = metrics.webrtc_sessions
        self._sent = metrics.webrtc_frames_sent
        self._skipped = metrics.webrtc_skipped
        self._sweeper: asyncio.Task[None] | None = None
        offer_host_addresses(host_addresses_for(config.host_addresses, bind_host))

    def session_ids(self) -> list[str]:
        return list(self._sessions)

    def count(self, stream_id: str | None = None) -> int:
        return sum(1 for s in self._sessions.values() if stream_id in (None, s.stream_id))

    async def open(
        self,
        stream_id: str,
        sdp: str,
        max_fps: float | None,
        max_width: int | None,
        raw: bool = False,
    ) -> tuple[str, str]:
        """Answer a viewer's offer: (session id, answer SDP); `raw`: the frames as
        captured rather than the workflow's video output. Raises UnknownStreamError,
        LimitError (429) or OfferError (400)."""
        if not self._runtime.has_stream(stream_id):
            raise UnknownStreamError(stream_id)
        self._check_room(stream_id)
        session = Session(
            uuid.uuid4().hex[:16], stream_id, RTCPeerConnection(rtc_configuration(self._config))
        )
        self._sessions[session.id] = session  # counted from now: limits hold under races
        self._gauge.labels(stream_id).inc()
        try:
            answer = await self._answer(session, sdp, max_fps, max_width, raw)
        except BaseException:
            await self.close(session.id)
            raise
        self._spawn(session, self._close_unless_connected(session))
        if self._sweeper is None or self._sweeper.done():
            self._sweeper = asyncio.ensure_future(self._sweep())
        return session.id, answer

    async def _sweep(self) -> None:
        """Close the sessions of streams that no longer exist, while any session is open."""
        while self._sessions:
            await asyncio.sleep(SWEEP_S)
            for session in list(self._sessions.values()):
                if not self._runtime.has_stream(session.stream_id):
                    await self.close(session.id)

    def _check_room(self, stream_id: str) -> None:
        cfg = self._config
        if len(self._sessions) >= cfg.max_sessions:
            raise LimitError(
                "webrtc.max_sessions",
                cfg.max_sessions,
                f"{len(self._sessions)} sessions are open",
                status=429,
                retry_after_s=RETRY_AFTER_S,
            )
        watching = self.count(stream_id)
        if watching >= cfg.max_sessions_per_stream:
            raise LimitError(
                "webrtc.max_sessions_per_stream",
                cfg.max_sessions_per_stream,
                f"{watching} sessions watch {stream_id}",
                status=429,
                retry_after_s=RETRY_AFTER_S,
            )

    async def _answer(
        self, session: Session, sdp: str, max_fps: float | None, max_width: int | None, raw: bool
    ) -> str:
        pc = session.pc
        feed = self._feed(session.stream_id)

        @pc.on("datachannel")
        def on_datachannel(channel: RTCDataChannel) -> None:
            if channel.label == CHANNEL:
                self._spawn(session, self._send_predictions(session, feed, channel))
            elif channel.label == FRAMES:
                session.frames = channel

        @pc.on("connectionstatechange")
        async def on_state() -> None:
            if pc.connectionState in ("failed", "closed"):
                await self.close(session.id)

        if "\nm=" not in sdp.replace("\r\n", "\n"):
            raise OfferError("invalid SDP offer: it has no media description (m= line)")
        try:
            await pc.setRemoteDescription(RTCSessionDescription(sdp=sdp, type="offer"))
        except Exception as exc:  # aiortc's parser raises ValueError, KeyError, ...
            raise OfferError(f"invalid SDP offer: {str(exc) or type(exc).__name__}") from exc
        if not any(t.kind == "video" for t in pc.getTransceivers()):
            raise OfferError(
                "the offer has no video section: add a receive-only video transceiver "
                '(addTransceiver("video", {direction: "recvonly"}))'
            )
        fps = min(max_fps or self._config.max_fps, self._config.max_fps)
        sent = self._sent.labels(session.stream_id)
        limit = self._config.max_buffered_bytes

        def on_sent(entry: Entry, rtp_timestamp: int | None) -> None:
            sent.inc()
            channel = session.frames
            if rtp_timestamp is None or channel is None or channel.readyState != "open":
                return
            if channel.bufferedAmount <= limit:  # else skipped: the video goes on
                channel.send(frame_message(entry, rtp_timestamp))

        session.track = NewestFrameTrack(feed, fps, max_width, on_sent, raw)
        session.track.clock.sender = pc.addTrack(session.track)
        try:
            await pc.setLocalDescription(await pc.createAnswer())
        except Exception as exc:  # e.g. no video codec in common
            raise OfferError(f"cannot answer the offer: {str(exc) or type(exc).__name__}") from exc
        return str(pc.localDescription.sdp)

    def _feed(self, stream_id: str) -> StreamFeed:
        shared = self._feeds.get(stream_id)
        if shared is None:
            loop = asyncio.get_running_loop()
            shared = self._feeds[stream_id] = _Shared(StreamFeed(self._runtime, stream_id, loop))
        shared.viewers += 1
        return shared.feed

    def _spawn(self, session: Session, work: Coroutine[Any, Any, None]) -> None:
        task = asyncio.ensure_future(work)
        session.tasks.add(task)
        task.add_done_callback(session.tasks.discard)

    async def _close_unless_connected(self, session: Session) -> None:
        await asyncio.sleep(self._config.connect_timeout_s)
        if session.pc.connectionState != "connected":
            log.info(
                "webrtc session %s (%s): not connected within %g s, closed",
                session.id,
                session.stream_id,
                self._config.connect_timeout_s,
            )
            await self.close(session.id)

    async def _send_predictions(
        self, session: Session, feed: StreamFeed, channel: RTCDataChannel
    ) -> None:
        """Each result's predictions while the channel is open; skipped (and counted)
        while more than `webrtc.max_buffered_bytes` wait in its buffer."""
        skipped = self._skipped.labels(session.stream_id)
        limit = self._config.max_buffered_bytes
        last = 0
        while channel.readyState in ("connecting", "open"):
            entry = await feed.newer_than(last)
            last = entry[0]
            if channel.readyState != "open":
                continue
            if channel.bufferedAmount > limit:
                skipped.inc()
                continue
            channel.send(feed.message(entry))

    async def close(self, session_id: str) -> bool:
        """End a session and free what it held; False if there is no such session."""
        session = self._sessions.pop(session_id, None)
        if session is None or session.closed:
            return False
        session.closed = True
        self._gauge.labels(session.stream_id).dec()
        current = asyncio.current_task()
        for task in list(session.tasks):
            if task is not current:
                task.cancel()
        if session.track is not None:
            session.track.stop()
        with contextlib.suppress(Exception):  # a half-made connection may fail to close
            await session.pc.close()
        self._release(session.stream_id)
        return True

    def _release(self, stream_id: str) -> None:
        shared = self._feeds.get(stream_id)
        if shared is None:
            return
        shared.viewers -= 1
        if shared.viewers <= 0:
            shared.feed.close()
            del self._feeds[stream_id]

    async def close_all(self) -> None:
        if self._sweeper is not None:
            self._sweeper.cancel()
        for session_id in list(self._sessions):
            await self.close(session_id)
