"""Small, allocation-free statistics kept per stream: recent latencies and rates."""

from __future__ import annotations

import threading
import time

import numpy as np


class LatencyWindow:
    """The last `size` samples (seconds) in a ring buffer; percentiles on demand.

    `add` is called from one worker thread per frame: a float store and an increment.
    Readers (API, summaries) copy under a lock, so they see a consistent window.
    """

    def __init__(self, size: int = 4096) -> None:
        self._buf = np.zeros(size, dtype=np.float64)
        self._n = 0
        self._lock = threading.Lock()

    def add(self, seconds: float) -> None:
        with self._lock:
            self._buf[self._n % self._buf.size] = seconds
            self._n += 1

    @property
    def count(self) -> int:
        return self._n

    def percentiles_ms(self, *qs: float) -> dict[str, float | None]:
        """{'p50': ms, ...} over the window; None when there is no sample yet."""
        with self._lock:
            data = self._buf[: min(self._n, self._buf.size)].copy()
        if data.size == 0:
            return {f"p{q:g}": None for q in qs}
        values = np.percentile(data, qs) * 1000.0
        return {f"p{q:g}": round(float(v), 3) for q, v in zip(qs, values, strict=True)}


class RateMeter:
    """Events per second: over the whole run, and over the latest completed window."""

    def __init__(self, window_s: float = 2.0) -> None:
        self._window_s = window_s
        self._start: float | None = None
        self._last = 0.0
        self._count = 0
        self._win_start = 0.0
        self._win_count = 0
        self._recent = 0.0

    def tick(self, now: float | None = None) -> None:
        now = time.perf_counter() if now is None else now
        if self._start is None:
            self._start = self._win_start = now
        self._last = now
        self._count += 1
        self._win_count += 1
        if now - self._win_start >= self._window_s:
            self._recent = self._win_count / (now - self._win_start)
            self._win_start, self._win_count = now, 0

    @property
    def count(self) -> int:
        return self._count

    def overall(self) -> float:
        """Mean rate between the first and the latest event (events/s)."""
        if self._start is None or self._count < 2:
            return 0.0
        elapsed = self._last - self._start
        return (self._count - 1) / elapsed if elapsed > 0 else 0.0

    def recent(self) -> float:
        """Rate over the last completed window (events/s); 0 before the first window."""
        return self._recent
