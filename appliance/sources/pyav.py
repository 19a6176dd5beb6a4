"""Every source kind decoded with PyAV (FFmpeg): RTSP, HTTP (MJPEG, HLS), V4L2, files.

Reads never block for long: av.open's interrupt callback aborts a read that waits
longer than its timeout. Live sources read in short slices (`READ_SLICE_S`) so that a
stop request or a stalled camera is noticed quickly; files use the stall timeout.
"""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import cast

import av
import av.container
from av.codec.codec import Codec
from av.codec.context import CodecContext
from av.codec.hwaccel import HWAccel, hwdevices_available

from appliance.sources.base import (
    DecodingSource,
    EndOfStreamError,
    FrameGenerator,
    SourceError,
    mask_url,
    source_kind,
)
from appliance.sources.config import DecoderConfig, SourceConfig
from appliance.sources.http import http_format
from appliance.sources.problems import ffmpeg_problem, no_answer
from appliance.sources.tls import CameraTls, camera_tls, certificate_problem
from pipelines.types import Image

# Longest one live read blocks, seconds: bounds how late a stop request or a stall is
# seen. A slice that runs out leaves the demuxer usable; reading simply continues.
# FFmpeg's demuxers that draw a text file's characters into video frames (libavformat's
# tty.c: .txt, .nfo, .asc, .ans, ...; bintext.c): a stream of one would show any text
# file it may name (a key, a .env) as video. Refused once FFmpeg has chosen one.
TEXT_FORMATS = frozenset({"tty", "bin", "xbin", "adf", "idf"})
READ_SLICE_S = 0.5
_MICROSECONDS = 1_000_000  # FFmpeg's socket timeouts are in microseconds
# Every NVDEC generation decodes H.264 (NVIDIA Video Codec SDK's support matrix).
_PROBE_CODEC = "h264"
# FFmpeg's RTSP reader hands its options on to its TLS layer (`tls_verify`, `ca_file`) in
# the FFmpeg 8.1 of PyAV 18.1's wheels (libavformat 62.12: an untrusted rtsps server gets
# nothing, tests/security/test_camera_tls.py); FFmpeg 7's rtsp.c opens its TLS connection
# with no options, unchecked, so an older FFmpeg reads rtsps only with `verify: false`.
RTSPS_VERIFIED = av.library_versions["libavformat"] >= (62, 12)


@dataclass(frozen=True, slots=True)
class DecoderPlan:
    """The decoder a session asks for, chosen once when it opens: the device settings
    for PyAV (None: software), and why a requested device was refused."""

    hwaccel: HWAccel | None
    problem: str | None

    @classmethod
    def of(cls, cfg: DecoderConfig) -> DecoderPlan:
        if cfg.hwaccel == "none":
            return cls(None, None)
        problem = device_problem("cuda", cfg.device)
        if problem is not None:
            return cls(None, f"{cfg.hwaccel} requested: {problem}; decoding in software")
        # allow_software_fallback: a stream NVDEC cannot take (a profile it lacks, e.g.
        # H.264 4:4:4) is decoded in software instead of failing (PyAV's HWAccel docs).
        return cls(HWAccel("cuda", device=str(cfg.device), allow_software_fallback=True), None)


@functools.cache  # a device that does not open now will not later in this process
def device_problem(device_type: str, device: int) -> str | None:
    """Why FFmpeg cannot open this hardware device for decoding, or None when it can.
    Opens a device context once (a CUDA context costs time and device memory; this
    one is freed at once) and keeps the answer for the process."""
    available = hwdevices_available()
    if device_type not in available:
        shown = ", ".join(available) or "none"
        return f"this FFmpeg has no {device_type} support (hwdevices_available: {shown})"
    try:
        HWAccel(device_type, device=str(device)).create(Codec(_PROBE_CODEC, "r"))
    except NotImplementedError:  # a device type FFmpeg's own H.264 decoder cannot use
        return f"FFmpeg's {_PROBE_CODEC} decoder has no {device_type} acceleration"
    except av.FFmpegError as exc:
        return (
            f"no {device_type.upper()} device {device} ({describe(exc)}; "
            f"hwdevices_available: {', '.join(available)})"
        )
    return None


def decoder_name(context: CodecContext) -> str:
    """What decodes a stream, e.g. "h264 cuda" or "hevc software"."""
    return f"{context.name} {'cuda' if context.is_hwaccel else 'software'}"


class PyAVSource(DecodingSource):
    """An opened container's first video stream, decoded to BGR frames.

    `label` (the path, or the masked URL) starts every error message. `stop`, when given,
    ends `frames()` at the next packet or read slice once set: the only safe way to
    interrupt a read (closing a container from another thread is not).
    """

    def __init__(
        self,
        container: av.container.InputContainer,
        *,
        live: bool,
        label: str,
        stall_timeout_s: float,
        stop: threading.Event | None = None,
        decoder_threads: int = 0,
        decoder_problem: str | None = None,
    ) -> None:
        if not container.streams.video:
            raise SourceError("no video stream")
        self._container = container
        self._stream = container.streams.video[0]
        self._decoder_name = decoder_name(self._stream.codec_context)
        self._decoder_problem = decoder_problem
        # Slice threading only: frame threading delays output by one frame per thread
        # (cameras want latency), and its extra threads compete with the model's threads
        # for the cores; measured with bench/pipeline_efficiency.py on 2 cores, frame
        # threading for files cut the appliance from 65 to 57 fps.
        self._stream.thread_type = "SLICE"
        if decoder_threads:  # 0: FFmpeg's own choice
            self._stream.codec_context.thread_count = decoder_threads
        self._live = live
        self._label = label
        self._stall_timeout_s = stall_timeout_s
        self._stop = stop or threading.Event()
        self._last_frame_mono = time.perf_counter()
        self._received_mono = self._last_frame_mono

    @property
    def is_live(self) -> bool:
        return self._live

    @property
    def fps(self) -> float | None:
        rate = self._stream.average_rate or self._stream.guessed_rate
        return float(rate) if rate else None

    def close(self) -> None:
        self._end_frames()
        self._container.close()

    def _generate(self) -> FrameGenerator:
        self._last_frame_mono = time.perf_counter()
        while not self._stop.is_set():
            try:
                yield from self._decode()
                if self._live and not self._stop.is_set():
                    # A live source has no end of its own: FFmpeg read EOF (RTSP: RTCP BYE
                    # on every track, or the connection closed). Said now, not at the
                    # stall timeout, so the grabber reconnects at once.
                    raise EndOfStreamError(f"{self._label}: end of stream")
                return
            except av.ExitError:  # a read slice ran out with no data
                self._check_stall()
            except av.FFmpegError as exc:
                raise SourceError(f"{self._label}: {describe(exc)}") from None

    def _decode(self) -> Iterator[tuple[Image, float | None]]:
        stream, stop = self._stream, self._stop
        # demux() ends with empty packets that flush the decoder's delayed frames.
        for packet in self._container.demux(stream):
            received = time.perf_counter()  # one float per packet: the frame's arrival
            if packet.is_corrupt and not self._live:
                # A cut-off file ends in a short packet flagged corrupt; frame-threaded
                # decoding would hide it and the clip would just end early, or loop.
                where = f"byte {packet.pos}" if packet.pos is not None else "a packet"
                raise SourceError(f"{self._label}: truncated or damaged data at {where}")
            for frame in stream.decode(packet):
                self._last_frame_mono = time.perf_counter()
                image = cast(Image, frame.to_ndarray(format="bgr24"))
                self._received_mono = received
                yield image, frame.time
            if stop.is_set():
                return
            if self._live:
                self._check_stall()

    def _check_stall(self) -> None:
        """Raise when a live source sent packets or nothing, but no frame, for too long."""
        if not self._live:
            raise SourceError(f"{self._label}: no data for {self._stall_timeout_s:g} s")
        silent = time.perf_counter() - self._last_frame_mono
        if silent > self._stall_timeout_s:
            raise SourceError(f"{self._label}: stalled, no frame for {silent:.1f} s")


def describe(exc: BaseException) -> str:
    """A short, credential-free message for an exception (FFmpeg's text without the URL)."""
    if isinstance(exc, av.FFmpegError) and exc.strerror:
        return mask_url(str(exc.strerror))
    return mask_url(str(exc) or type(exc).__name__)


def open_pyav(
    cfg: SourceConfig,
    resolve_path: Callable[[str], Path],
    *,
    stop: threading.Event | None = None,
) -> PyAVSource:
    """Open a source with FFmpeg's readers; raises SourceError naming the (masked) URL or
    path. Blocks up to `cfg.open_timeout_s`. `stop` lets another thread end `frames()`.
    """
    live = source_kind(cfg.url) != "file"
    tls = camera_tls(cfg, resolve_path) if live else None
    target, fmt, options = _live_target(cfg, tls) if live else _file_target(cfg, resolve_path)
    label = mask_url(target)
    read_timeout = min(cfg.stall_timeout_s, READ_SLICE_S) if live else cfg.stall_timeout_s
    plan = DecoderPlan.of(cfg.decoder)
    timeouts = (cfg.open_timeout_s, read_timeout)
    container = _open_container(target, label, fmt, options, timeouts, plan.hwaccel, tls)
    if (demuxer := container.format.name) in TEXT_FORMATS:
        container.close()
        raise SourceError(f"{label}: not a video: FFmpeg reads it as text ({demuxer})")
    try:
        return PyAVSource(
            container,
            live=live,
            label=label,
            stall_timeout_s=cfg.stall_timeout_s,
            stop=stop,
            decoder_threads=cfg.decoder_threads,
            decoder_problem=plan.problem,
        )
    except SourceError as exc:
        container.close()
        raise SourceError(f"{label}: {exc}") from None


def _open_container(
    target: str,
    label: str,
    fmt: str | None,
    options: dict[str, str],
    timeouts: tuple[float, float],
    hwaccel: HWAccel | None,
    tls: CameraTls | None,
) -> av.container.InputContainer:
    """av.open with (open, read) timeouts and the hardware decoder (None: software);
    SourceError naming `label` when it fails (a TLS camera's certificate, when that is
    why: FFmpeg says only "Input/output error")."""
    started = time.perf_counter()
    try:
        return av.open(target, format=fmt, options=options, timeout=timeouts, hwaccel=hwaccel)
    except (av.FFmpegError, OSError) as exc:
        # The interrupt callback's abort surfaces as whatever the demuxer made of it
        # (RTSP: "Invalid data"); the elapsed time tells the real story.
        if time.perf_counter() - started >= timeouts[0]:
            raise SourceError(f"{label}: {no_answer(target, timeouts[0])}") from None
        problem = None
        if tls is not None and isinstance(exc, OSError):
            problem = certificate_problem(target, tls, timeouts[0])
        problem = problem or ffmpeg_problem(target, exc)  # None for files and devices
        raise SourceError(f"{label}: {problem or describe(exc)}") from None


_Target = tuple[str, str | None, dict[str, str]]


def _file_target(cfg: SourceConfig, resolve_path: Callable[[str], Path]) -> _Target:
    """A file: its resolved path, probed format, the user's options."""
    path = resolve_path(cfg.url)
    if not path.is_file():
        raise SourceError(f"{path}: file not found")
    return str(path), None, dict(cfg.options)


def _live_target(cfg: SourceConfig, tls: CameraTls | None) -> _Target:
    """A live URL with the demuxer and options its kind needs, and its TLS camera's
    certificate check (`tls`); the user's options win."""
    kind = source_kind(cfg.url)
    # A dead camera must not hold a socket read forever (FFmpeg >= 5 calls it `timeout`;
    # the old RTSP `stimeout` is gone). The interrupt callback bounds reads as well.
    socket_timeout = str(int(cfg.open_timeout_s * _MICROSECONDS))
    fmt: str | None = None
    options: dict[str, str] = {} if tls is None else dict(tls.ffmpeg)
    if kind == "rtsp":
        if tls is not None and tls.verify and not RTSPS_VERIFIED:
            raise SourceError(
                f"{mask_url(cfg.url)}: this FFmpeg's RTSP reader cannot check an rtsps "
                "camera's certificate (libavformat < 62.12): set source.tls.verify: false "
                "to read it unchecked, or use our reader (reader: auto, no options; H.264 "
                "and H.265)"
            )
        options |= {"rtsp_transport": cfg.transport, "timeout": socket_timeout}
    elif kind == "http":
        fmt = http_format(cfg.url, cfg.open_timeout_s, None if tls is None else tls.context)
        options |= {"timeout": socket_timeout}
    elif kind == "v4l2":
        fmt = "v4l2"
    return cfg.url, fmt, {**options, **cfg.options}
