"""The one-slot buffer between a grabber and its worker: the worker always gets the newest frame.

A live camera does not wait for a slow workflow, so an unconsumed frame is replaced and
counted in `dropped`: latency stays at one frame instead of growing with a queue.
Files played `pace: fast` (benchmarks, batch jobs) want every frame instead: in blocking
mode `put` waits until the previous frame was taken.
"""

from __future__ import annotations

import threading
import time

from pipelines.types import Frame


class LatestFrame:
    """A one-frame mailbox guarded by a Condition; the lock is held only for pointer swaps."""

    def __init__(self, *, blocking: bool = False) -> None:
        self.blocking = blocking
        self._cond = threading.Condition()
        self._frame: Frame | None = None
        self._closed = False
        self.produced = 0  # frames put
        self.dropped = 0  # frames replaced before anyone took them
        self.last_put_mono = 0.0  # time.perf_counter() of the newest put; 0.0 before any

    @property
    def closed(self) -> bool:
        """True once `close()` was called; no more frames will be accepted."""
        return self._closed

    def put(self, frame: Frame) -> None:
        """Offer the newest frame; replaces (and counts) an unconsumed one.

        In blocking mode waits until the previous frame was taken instead. After
        `close()` the frame is discarded and put returns at once.
        """
        now = time.perf_counter()
        with self._cond:
            if self.blocking:
                self._cond.wait_for(self._has_room)
            if self._closed:
                return
            if self._frame is not None:
                self.dropped += 1
            self._frame = frame
            self.produced += 1
            self.last_put_mono = now
            self._cond.notify_all()

    def get(self, timeout: float) -> Frame | None:
        """Take the newest frame, waiting up to `timeout` seconds.

        Each frame is returned once. None on timeout, or when closed and empty.
        """
        with self._cond:
            if not self._cond.wait_for(self._has_frame_or_closed, timeout):
                return None
            frame, self._frame = self._frame, None
            if self.blocking:
                self._cond.notify_all()  # a producer may wait for the room
            return frame

    def close(self) -> None:
        """Wake every waiting producer and consumer; a frame still held can still be taken."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    def _has_room(self) -> bool:
        return self._frame is None or self._closed

    def _has_frame_or_closed(self) -> bool:
        return self._frame is not None or self._closed
