"""The grabber thread: open a source, decode it, pace files, reconnect cameras.

One thread per stream (`grab:{stream_id}`) puts every decoded frame into the stream's
LatestFrame slot. Live sources (RTSP, HTTP, V4L2) reconnect forever with capped
exponential backoff; files loop or stop at their end and fail for good when they cannot
be decoded. Every blocking step wakes up on stop(): opening runs in a helper thread
that is abandoned on stop, reads run in short slices, waits are on the stop Event.
"""

from __future__ import annotations

import itertools
import logging
import random
import threading
import time
import traceback
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path

from appliance.policy.hosts import ANY_HOST, SourceHosts
from appliance.sources.backoff import Backoff
from appliance.sources.base import (
    SourceError,
    StateCallback,
    StreamState,
    VideoSource,
    mask_url,
    source_kind,
)
from appliance.sources.config import SourceConfig
from appliance.sources.opener import open_source
from appliance.sources.pacing import Pacer
from appliance.sources.slot import LatestFrame
from appliance.sources.tls import uses_tls
from pipelines.types import Frame, Image

log = logging.getLogger(__name__)
DECODE_WARN_EVERY_S = 10.0  # undecodable frames are logged at most this often

_FPS_SMOOTHING = 0.1  # EWMA weight of the newest frame interval (~10 frames of memory)


def slot_for(cfg: SourceConfig) -> LatestFrame:
    """The slot a source needs: blocking (every frame) for `pace: fast` files, else newest-only."""
    return LatestFrame(blocking=source_kind(cfg.url) == "file" and cfg.pace == "fast")


@dataclass(frozen=True, slots=True)
class GrabberStats:
    """A snapshot of a grabber's counters; times are time.perf_counter() seconds."""

    state: StreamState
    frames: int  # decoded and handed to the slot, across reconnects
    reconnects: int  # retries after a failure, stall or end of a live stream
    last_error: str | None  # masked
    fps: float | None  # measured rate of delivered frames
    last_frame_mono: float  # heartbeat: 0.0 before the first frame
    retry_delay_s: float | None  # the latest backoff delay
    # Heartbeat of the read in progress: when it began, 0.0 while not reading (opening,
    # pacing, handing a frame over, waiting to retry). The supervisor reports a read
    # older than limits.worker_stall_s: the source's own timeouts should have ended it.
    reading_since: float
    # What decodes the current (or last) session, e.g. "h264 cuda"; None before an open.
    decoder: str | None = None
    # Why the hardware decoder `source.decoder` asked for was refused; None if not.
    decoder_problem: str | None = None


class Grabber:
    """Decodes one stream's source into its slot on a thread named `grab:{stream_id}`."""

    def __init__(
        self,
        stream_id: str,
        cfg: SourceConfig,
        slot: LatestFrame,
        on_state: StateCallback,
        resolve_path: Callable[[str], Path],
        *,
        rng: random.Random | None = None,
        hosts: SourceHosts = ANY_HOST,
    ) -> None:
        self.stream_id = stream_id
        self._hosts = hosts  # checked before each connection
        self._cfg = cfg
        self._slot = slot
        self._on_state = on_state
        self._resolve_path = resolve_path
        self._live = source_kind(cfg.url) != "file"
        self._label = mask_url(cfg.url)
        self._backoff = Backoff(cfg.backoff, rng)
        self._stop = threading.Event()
        self._wake = threading.Event()  # set by stop() and by a finished open
        self._thread: threading.Thread | None = None
        self._state = StreamState.STARTING
        self._seq = 0  # also the count of frames delivered
        self._reconnects = 0
        self._last_error: str | None = None
        self._retry_at: float | None = None  # time.monotonic() of the announced retry
        self._decode_warned = -DECODE_WARN_EVERY_S  # time.monotonic() of the last warning
        self._retry_delay_s: float | None = None
        self._interval_s: float | None = None  # EWMA of the frame interval
        self._prev_frame_mono: float | None = None  # this session's previous frame
        self._last_frame_mono = 0.0
        self._reading_since = 0.0  # one float store per frame each way, no lock
        self._decoder: tuple[str, str | None] | None = None  # (decoder, its problem)
        # Called with (seq, read start, data received, decoded) per frame (profiling).
        self.on_grabbed: Callable[[int, float, float, float], None] | None = None
        # Called (grab thread) with a problem that changes no state: frames skipped.
        self.on_problem: Callable[[str], None] | None = None

    def start(self) -> None:
        """Start the thread; call once."""
        if self._thread is not None:
            raise RuntimeError(f"grabber {self.stream_id} already started")
        if uses_tls(self._cfg.url) and not self._cfg.tls.verify:
            log.warning(
                "stream %r: source.tls.verify is false: the camera's TLS certificate is "
                "not checked, so whoever answers at its address receives its credentials",
                self.stream_id,
            )
        self._thread = threading.Thread(target=self._run, name=f"grab:{self.stream_id}")
        self._thread.daemon = True  # never keeps the process alive; stop() joins it
        self._thread.start()

    def stop(self, timeout: float = 2.0) -> bool:
        """Ask the thread to end and wait up to `timeout` s; True when it has ended.

        Also closes the slot, so that a blocked `put` and a waiting consumer wake up.
        """
        self._stop.set()
        self._wake.set()
        self._slot.close()
        if self._thread is None:
            return True
        self._thread.join(timeout)
        return not self._thread.is_alive()

    @property
    def alive(self) -> bool:
        """The thread runs (after stop(): it did not end in time)."""
        return self._thread is not None and self._thread.is_alive()

    @property
    def stats(self) -> GrabberStats:
        """Counters as of now (read without a lock: each field is one atomic store)."""
        interval = self._interval_s
        return GrabberStats(
            state=self._state,
            frames=self._seq,
            reconnects=self._reconnects,
            last_error=self._last_error,
            fps=1.0 / interval if interval else None,
            last_frame_mono=self._last_frame_mono,
            retry_delay_s=self._retry_delay_s,
            reading_since=self._reading_since,
            decoder=None if self._decoder is None else self._decoder[0],
            decoder_problem=None if self._decoder is None else self._decoder[1],
        )

    def _run(self) -> None:
        self._emit(StreamState.STARTING, f"opening {self._label}")
        try:
            state, reason = self._loop()
        except Exception as exc:  # a bug, not a source problem: report it, do not hide it
            _log_exception(f"grabber {self.stream_id} crashed", exc)
            state, reason = StreamState.FAILED, f"internal error: {exc!r}"
        self._slot.close()
        self._emit(state, reason)

    def _loop(self) -> tuple[StreamState, str]:
        """Sessions until stopped (live) or until the file ends or fails; the final state."""
        while not self._stop.is_set():
            error = self._session()
            if self._stop.is_set():
                break
            if not self._live:
                if error is not None:
                    return StreamState.FAILED, error
                if self._cfg.loop:
                    continue
                return StreamState.STOPPED, "end of file"
            if not self._wait_to_retry(error or f"{self._label}: end of stream"):
                break
        return StreamState.STOPPED, "stopped"

    def _session(self) -> str | None:
        """Open, deliver frames until the end of the stream or stop, close; the error."""
        try:
            source = self._open()
            if source is None:
                return None
            self._decoder_chosen(source)
            try:
                self._pump(source)
            except SourceError as exc:
                # Said now, not after close: closing a hung camera's session waits for its
                # TEARDOWN answer (up to 2 s), and the stall must be reported in time.
                if self._live and not self._stop.is_set():
                    self._announce_retry(str(exc))
                raise
            finally:
                source.close()
        except SourceError as exc:
            return str(exc)
        return None

    def _open(self) -> VideoSource | None:
        """Open in a helper thread and wait for it or for stop(); None when stopped first.

        av.open cannot be interrupted before its open timeout (10 s by default); an
        abandoned open finishes on its own and closes what it opened.
        """
        self._wake.clear()
        if self._stop.is_set():
            return None
        future = _open_in_thread(
            lambda: open_source(self._cfg, self._resolve_path, stop=self._stop, hosts=self._hosts),
            name=f"open:{self.stream_id}",
        )
        future.add_done_callback(lambda _f: self._wake.set())
        self._wake.wait()
        if future.done():
            return future.result()
        future.add_done_callback(_close_abandoned)
        return None

    def _pump(self, source: VideoSource) -> None:
        frames = source.frames()
        self._reading_since = time.perf_counter()
        try:
            first = next(frames, None)
            if first is None:
                if not self._live and not self._stop.is_set():  # else an empty file loops
                    raise SourceError(f"{self._label}: no video frames")
                return
            self._on_first_frame(source, first[0])
            pace = Pacer(self._stop, source.fps) if self._paced else None
            grabbed, start = self.on_grabbed, self._last_frame_mono or time.perf_counter()
            skipped = source.decode_errors
            for image, pts in itertools.chain([first], frames):
                self._reading_since = 0.0  # pacing and a full slot are waits, not reads
                if source.decode_errors != skipped:  # damaged frames, skipped: say so
                    skipped = self._decode_errors_seen(source, skipped)
                if grabbed is not None:  # the profiler's hook: this frame's read and decode
                    grabbed(self._seq, start, source.received_mono, time.perf_counter())
                if pace is not None and not pace.wait(pts):
                    return
                # A camera's frame is as old as its arrival; a file's, as its release.
                self._deliver(image, pts, source.received_mono if self._live else None)
                self._reading_since = start = time.perf_counter()  # the next read begins
        finally:
            self._reading_since = 0.0

    def _decoder_chosen(self, source: VideoSource) -> None:
        """Keep what decodes this session; a refused hardware decoder is logged when it
        is first seen (a camera that reconnects every few seconds logs it once)."""
        chosen = (source.decoder, source.decoder_problem)
        problem, known = chosen[1], self._decoder
        self._decoder = chosen
        if problem is None or (known is not None and known[1] == problem):
            return
        explicit = self._cfg.decoder.hwaccel == "cuda"
        level = logging.WARNING if explicit else logging.INFO
        log.log(level, "stream %s: %s (%s)", self.stream_id, problem, source.decoder)

    @property
    def _paced(self) -> bool:
        return not self._live and self._cfg.pace == "realtime"

    def _on_first_frame(self, source: VideoSource, image: Image) -> None:
        self._backoff.reset()
        self._interval_s = None
        self._prev_frame_mono = None  # the gap before a reconnect is no frame interval
        if self._state is not StreamState.RUNNING:  # a looping file stays RUNNING
            height, width = image.shape[:2]
            fps = f"{source.fps:g} fps" if source.fps else "unknown fps"
            self._emit(StreamState.RUNNING, f"{self._label}: {width}x{height} at {fps}")

    def _deliver(self, image: Image, pts: float | None, received: float | None) -> None:
        now = time.perf_counter()
        wall = time.time()
        if received is not None:  # the arrival, on both clocks
            wall, captured = wall - (now - received), received
        else:
            captured = now
        self._slot.put(Frame(self.stream_id, self._seq, pts, wall, captured, image))
        self._seq += 1
        if self._prev_frame_mono is not None:
            dt = now - self._prev_frame_mono
            prev = self._interval_s
            self._interval_s = dt if prev is None else prev + _FPS_SMOOTHING * (dt - prev)
        self._prev_frame_mono = self._last_frame_mono = now

    def _decode_errors_seen(self, source: VideoSource, before: int) -> int:
        count, error = source.decode_errors, source.last_decode_error
        self._last_error = mask_url(
            f"{self._label}: {count - before} frame(s) undecodable "
            f"({error}); skipped to the next keyframe"
        )
        now = time.monotonic()
        if now - self._decode_warned >= DECODE_WARN_EVERY_S:  # a flaky camera: no flood
            self._decode_warned = now
            log.warning("stream %s: %s", self.stream_id, self._last_error)
        if self.on_problem is not None:
            self.on_problem(self._last_error)
        return count

    def _announce_retry(self, reason: str) -> None:
        """Report RECONNECTING with the next backoff delay, which counts from now."""
        delay = self._backoff.next_delay()
        self._reconnects += 1
        self._last_error = reason
        self._retry_delay_s = delay
        self._retry_at = time.monotonic() + delay
        self._emit(StreamState.RECONNECTING, f"{reason}; retrying in {delay:.2f} s")

    def _wait_to_retry(self, reason: str) -> bool:
        """Report RECONNECTING (unless the session's end did already) and wait out the
        backoff delay; False when stopped."""
        if self._retry_at is None:
            self._announce_retry(reason)
        assert self._retry_at is not None
        delay, self._retry_at = max(0.0, self._retry_at - time.monotonic()), None
        return not self._stop.wait(delay)

    def _emit(self, state: StreamState, reason: str) -> None:
        reason = mask_url(reason)  # the last guard: reasons reach logs, /health, the UI
        self._state = state
        log.debug("stream %s %s: %s", self.stream_id, state.value, reason)  # the stream logs it
        try:
            self._on_state(state, reason)
        except Exception as exc:  # the runtime's bug must not kill the camera thread
            _log_exception(f"state callback of stream {self.stream_id} failed", exc)


def _log_exception(message: str, exc: BaseException) -> None:
    """log.exception with URLs masked: a traceback's messages may carry credentials."""
    trace = "".join(traceback.format_exception(exc))
    log.error("%s\n%s", message, mask_url(trace))


def _open_in_thread(open_fn: Callable[[], VideoSource], name: str) -> Future[VideoSource]:
    future: Future[VideoSource] = Future()

    def run() -> None:
        try:
            future.set_result(open_fn())
        except BaseException as exc:  # handed to the waiting grabber thread
            future.set_exception(exc)

    threading.Thread(target=run, name=name, daemon=True).start()
    return future


def _close_abandoned(future: Future[VideoSource]) -> None:
    if future.exception() is None:
        future.result().close()
