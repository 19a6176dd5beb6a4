"""RTSP cameras read over RTP by our own depacketizer: a frame decodes as its last packet lands.

FFmpeg's RTSP reader parses H.264/H.265 with a parser that finds the end of a frame only
when the next frame's first packet arrives, so every frame waits one frame interval
(67 ms at 15 fps) before it is even decoded; it ignores the RTP marker bit that ends the
frame. Here aiortsp runs the RTSP session (OPTIONS, DESCRIBE, SETUP, PLAY, keep-alives,
Basic/Digest authentication, TCP-interleaved or UDP transport) on its connection
(rtsp.py), depacketize.py rebuilds each access unit and hands it to the decoder the
moment its marker packet arrives. Codecs other than H.264/H.265 go to FFmpeg's reader
(pyav.py).

The asyncio loop has no thread of its own: the thread that iterates `frames()` runs it
while waiting for packets, in slices of `READ_SLICE_S`, so a stop request or a stall is
seen as quickly as with FFmpeg's reader, and a slow consumer leaves packets in the
socket (TCP flow control) instead of in a growing queue here.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import threading
import time
from collections.abc import Iterator
from typing import Any, cast
from urllib.parse import unquote, urlsplit

import av
import av.video.codeccontext
from aiortsp.rtcp.parser import BYE, RTCP
from aiortsp.rtsp.session import RTSPMediaSession
from aiortsp.transport import RTPTransportClient, TCPTransport, UDPTransport

from appliance.sources.base import (
    DecodingSource,
    EndOfStreamError,
    FrameGenerator,
    SourceError,
    mask_url,
)
from appliance.sources.config import SourceConfig
from appliance.sources.depacketize import (
    CODECS,
    Codec,
    Depacketizer,
    parameter_sets,
    strip_payload,
)
from appliance.sources.pyav import READ_SLICE_S, DecoderPlan, decoder_name, describe
from appliance.sources.rtsp import CLOSE_TIMEOUT_S, Connection, open_problem
from appliance.sources.tls import CameraTls
from pipelines.types import Image

# aiortsp logs every request, and its errors with the server's whole answer; the source
# reports what went wrong itself (SourceError, credentials masked), so its log stays off.
_QUIET = logging.getLogger("appliance.sources.rtp.aiortsp")
_QUIET.disabled = True


class UnsupportedCodecError(SourceError):
    """The camera's video is neither H.264 nor H.265: FFmpeg's reader must take it."""


_Packet = tuple[bytes, int, int, bool, float]


class _Receiver(RTPTransportClient):  # type: ignore[misc]
    """The session's RTP packets of one payload type, with their arrival times.

    While the reader waits (`waiting`), a packet that ends a frame (the marker bit), or
    the session's end, stops the loop: one loop run per frame, no task or timer per packet.
    The session ends with an error, or at the end of the stream (`ended`): the camera's
    RTCP BYE for the video's source, or the RTSP connection closed by the camera.
    """

    def __init__(self, payload_type: int, loop: asyncio.AbstractEventLoop) -> None:
        self.payload_type = payload_type
        # (payload, sequence number, timestamp, marker, arrival perf_counter())
        self.packets: collections.deque[_Packet] = collections.deque()
        self.closed: str | None = None
        self.ended = False  # `closed` is the end of the stream, not an error
        self.waiting = False
        self._ssrc: int | None = None  # the video's RTP source, once a packet came
        self._loop = loop

    def handle_rtp(self, rtp: Any) -> None:
        """A packet aiortsp has parsed (dpkt): its payload, header fields and arrival."""
        if rtp.pt != self.payload_type:
            return
        self._ssrc = rtp.ssrc
        payload = strip_payload(rtp.data, rtp.x, rtp.p)
        if payload is not None:
            self.packets.append((payload, rtp.seq, rtp.ts, bool(rtp.m), time.perf_counter()))
        if rtp.m and self.waiting:
            self._loop.stop()

    def handle_rtcp(self, rtcp: RTCP) -> None:
        """RTCP BYE from the video's source (RFC 3550 6.6): the camera's stream has ended,
        e.g. a served clip at its end; the session stays open but nothing more comes."""
        for packet in rtcp.packets:
            if isinstance(packet, BYE) and (self._ssrc is None or self._ssrc in packet.ssrcs):
                self._end("the camera sent RTCP BYE", ended=True)

    def handle_closed(self, error: Exception | None) -> None:
        if error is None:
            self._end("the camera closed the connection", ended=True)
        else:
            self._end(describe(error), ended=False)

    def _end(self, why: str, *, ended: bool) -> None:
        if self.closed is None:  # the first word stays: a BYE, then the socket's close
            self.closed, self.ended = why, ended
        if self.waiting:
            self._loop.stop()


class RtpSource(DecodingSource):
    """An RTSP camera's H.264/H.265 video, decoded frame by frame as each one completes.

    Made by `open_rtp`; the same contract as PyAVSource (appliance.sources.base.VideoSource).
    """

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        stack: contextlib.AsyncExitStack,
        receiver: _Receiver,
        codec: Codec,
        media: dict[str, Any],
        *,
        label: str,
        stall_timeout_s: float,
        stop: threading.Event | None,
        decoder_threads: int,
        plan: DecoderPlan,
    ) -> None:
        attributes = media.get("attributes", {})
        self._loop, self._stack, self._receiver = loop, stack, receiver
        self._label = label
        self._stall_timeout_s = stall_timeout_s
        self._stop = stop or threading.Event()
        self._clock_hz = float(attributes["rtpmap"]["clockRate"])
        self._sdp_fps = attributes.get("framerate")
        self._depacketizer = Depacketizer(codec)
        self._decoder: av.video.codeccontext.VideoCodecContext = av.CodecContext.create(
            codec,
            "r",
            hwaccel=plan.hwaccel,  # None: software
        )
        self._decoder_name = decoder_name(self._decoder)
        self._decoder_problem = plan.problem
        self._decoder.thread_type = "SLICE"  # frame threads would delay output (pyav.py)
        if decoder_threads:  # 0: FFmpeg's own choice
            self._decoder.thread_count = decoder_threads
        extradata = parameter_sets(codec, attributes.get("fmtp", {}))
        if extradata:
            self._decoder.extradata = extradata
        self._received_mono = time.perf_counter()
        self._last_frame_mono = self._received_mono
        self._unwrap = _Unwrap()
        self._closed = False

    @property
    def is_live(self) -> bool:
        return True

    @property
    def fps(self) -> float | None:
        rate = self._decoder.framerate  # the stream's own timing (H.264 VUI), once decoded
        if rate:
            return float(rate)
        return float(self._sdp_fps) if self._sdp_fps else None

    def close(self) -> None:
        self._end_frames()
        if self._closed:
            return
        self._closed = True
        _shut(self._loop, self._stack)

    def _generate(self) -> FrameGenerator:
        self._last_frame_mono = time.perf_counter()
        keyframe_seen = False
        while not self._stop.is_set():
            got = self._next_packet()
            if got is None:
                self._check_stall()
                continue
            payload, seq, timestamp, marker, arrived = got
            for unit in self._depacketizer.push(payload, seq, timestamp, marker):
                if not (keyframe_seen or unit.keyframe):
                    continue  # the decoder needs a keyframe to start from
                keyframe_seen = True
                for image, pts in self._decode(unit.data, unit.timestamp):
                    self._received_mono = arrived
                    yield image, pts
            self._check_stall()

    def _decode(self, data: bytes, timestamp: int) -> Iterator[tuple[Image, float | None]]:
        packet = av.Packet(data)
        packet.pts = self._unwrap(timestamp)
        try:
            frames = self._decoder.decode(packet)
        except av.FFmpegError as exc:  # one damaged frame; the next keyframe repairs it
            self._last_decode_error = describe(exc)
            self._decode_errors += 1
            return
        for frame in frames:
            self._last_frame_mono = time.perf_counter()
            pts = None if frame.pts is None else frame.pts / self._clock_hz
            yield cast(Image, frame.to_ndarray(format="bgr24")), pts

    def _next_packet(self) -> _Packet | None:
        """The next RTP packet; when none is queued, runs the loop until a frame's last
        packet arrives or one read slice has passed (then None)."""
        receiver, loop = self._receiver, self._loop
        if receiver.packets:
            return receiver.packets.popleft()
        if receiver.closed is not None:  # every packet before the end was taken
            if receiver.ended:
                raise EndOfStreamError(f"{self._label}: end of stream ({receiver.closed})")
            raise SourceError(f"{self._label}: {receiver.closed}")
        timer = loop.call_later(READ_SLICE_S, loop.stop)
        receiver.waiting = True
        try:
            loop.run_forever()
        finally:
            receiver.waiting = False
            timer.cancel()
        return receiver.packets.popleft() if receiver.packets else None

    def _check_stall(self) -> None:
        silent = time.perf_counter() - self._last_frame_mono
        if silent > self._stall_timeout_s:
            last = self._last_decode_error
            why = f" (decoder: {last})" if last else ""
            raise SourceError(f"{self._label}: stalled, no frame for {silent:.1f} s{why}")


class _Unwrap:
    """RTP's 32-bit timestamps as one growing count (RFC 3550 5.1: they wrap)."""

    def __init__(self) -> None:
        self._last: int | None = None
        self._offset = 0

    def __call__(self, timestamp: int) -> int:
        if self._last is not None and timestamp < self._last and self._last - timestamp > 1 << 31:
            self._offset += 1 << 32
        self._last = timestamp
        return timestamp + self._offset


def open_rtp(
    cfg: SourceConfig, tls: CameraTls | None, *, stop: threading.Event | None = None
) -> RtpSource:
    """Set up and play the camera's video (`tls`: an rtsps camera's certificate check);
    SourceError (UnsupportedCodecError for codecs other than H.264/H.265) naming the masked
    URL. Blocks up to `cfg.open_timeout_s`."""
    label = mask_url(cfg.url)
    loop = asyncio.new_event_loop()
    stack = contextlib.AsyncExitStack()
    try:
        receiver, codec, media = loop.run_until_complete(
            asyncio.wait_for(_play(cfg, tls, stack), cfg.open_timeout_s)
        )
        return RtpSource(
            loop,
            stack,
            receiver,
            codec,
            media,
            label=label,
            stall_timeout_s=cfg.stall_timeout_s,
            stop=stop,
            decoder_threads=cfg.decoder_threads,
            plan=DecoderPlan.of(cfg.decoder),
        )
    except UnsupportedCodecError:
        _shut(loop, stack)
        raise  # the caller hands the camera to FFmpeg's reader
    except SourceError as exc:
        _shut(loop, stack)
        raise SourceError(f"{label}: {exc}") from None
    except Exception as exc:
        _shut(loop, stack)
        raise SourceError(f"{label}: {open_problem(exc, cfg)}") from None
    except BaseException:
        _shut(loop, stack)
        raise


async def _play(
    cfg: SourceConfig, tls: CameraTls | None, stack: contextlib.AsyncExitStack
) -> tuple[_Receiver, Codec, dict[str, Any]]:
    url = urlsplit(cfg.url)
    user = unquote(url.username) if url.username else None
    password = unquote(url.password) if url.password else None
    connection = Connection(
        url.hostname,
        url.port or (554 if tls is None else 322),  # rtsps: port 322, media interleaved
        user,
        password,
        logger=_QUIET,
        timeout=cfg.open_timeout_s,
        ssl=None if tls is None else tls.context,
    )
    await stack.enter_async_context(connection)
    kind = TCPTransport if cfg.transport == "tcp" or tls is not None else UDPTransport
    # Its own no-data timeout backs up the reader's stall check, which speaks first.
    transport = kind(connection, logger=_QUIET, timeout=cfg.stall_timeout_s + 1.0)
    await stack.enter_async_context(transport)
    session = RTSPMediaSession(connection, cfg.url, transport=transport, logger=_QUIET)
    await stack.enter_async_context(session)
    media = session.sdp.get_media("video") if session.sdp else None
    rtpmap = (media or {}).get("attributes", {}).get("rtpmap")
    if media is None:
        raise SourceError("the camera offers no video stream")
    if rtpmap is None:  # a static payload type (RFC 3551), e.g. 26 for JPEG
        raise UnsupportedCodecError(f"video is RTP payload type {media.get('format')}")
    codec = CODECS.get(str(rtpmap["encoding"]).upper())
    if codec is None:
        raise UnsupportedCodecError(f"video is {rtpmap['encoding']}, not H.264 or H.265")
    receiver = _Receiver(int(rtpmap["pt"]), asyncio.get_running_loop())
    transport.subscribe(receiver)
    # A camera that goes away closes the RTSP connection; aiortsp's transport tells its
    # subscribers nothing then (only the stall timeout would notice, seconds later).
    connection.result.add_done_callback(lambda done: receiver.handle_closed(_lost(done)))
    await session.play()
    stack.push_async_callback(_cancel, asyncio.ensure_future(_keep_alive(session)))
    return receiver, codec, media


def _lost(done: asyncio.Future[Any]) -> Exception | None:
    """Why the RTSP connection ended: its error, or None when it closed cleanly."""
    if done.cancelled():
        return None
    error = done.exception()
    return error if isinstance(error, Exception) else None


async def _keep_alive(session: RTSPMediaSession) -> None:
    """GET_PARAMETER (or OPTIONS) within the session timeout the camera announced."""
    while True:
        await asyncio.sleep(max(1, session.session_keepalive))
        with contextlib.suppress(Exception):  # a dead session shows as a stall instead
            await session.keep_alive()


async def _cancel(task: asyncio.Future[Any]) -> None:
    task.cancel()
    with contextlib.suppress(BaseException):
        await task


def _shut(loop: asyncio.AbstractEventLoop, stack: contextlib.AsyncExitStack) -> None:
    """TEARDOWN, close the sockets and the loop, within `CLOSE_TIMEOUT_S`."""
    if loop.is_closed():
        return
    with contextlib.suppress(BaseException):
        loop.run_until_complete(asyncio.wait_for(stack.aclose(), CLOSE_TIMEOUT_S))
    for task in asyncio.all_tasks(loop):
        task.cancel()
    with contextlib.suppress(BaseException):
        loop.run_until_complete(loop.shutdown_default_executor())
    loop.close()
