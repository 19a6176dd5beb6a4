"""What one measuring window saw: processed frames per second, and the frames' age when
their result was ready (capture to result: what a camera user waits), from every
result the outputs fan out. Subscribed to the runtime's outputs like the API's latest
results: one row stored per frame under a lock, nothing allocated.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

import numpy as np

from pipelines.types import FrameResult

RING = 1 << 16  # rows: 18 min of 4 streams at 15 fps; a window needs seconds of them


@dataclass(frozen=True)
class Window:
    """One window's figures. `fps`: results per second over every stream; `offered_fps`:
    the frames the sources delivered per second (what the objective's latency mode must
    keep up with); ages in ms; `slowest_fps` the slowest stream's own rate."""

    seconds: float
    frames: int
    fps: float
    p50_ms: float
    p99_ms: float
    offered_fps: float
    slowest_fps: float
    streams: dict[str, float] = field(default_factory=dict)  # id -> its fps

    def row(self) -> dict[str, float | None]:
        """The figures a report prints (JSON-ready: a window without frames has no age,
        null rather than JSON's non-standard Infinity)."""
        return {
            "fps": round(self.fps, 2),
            "p50_ms": round(self.p50_ms, 1) if self.frames else None,
            "p99_ms": round(self.p99_ms, 1) if self.frames else None,
            "offered_fps": round(self.offered_fps, 2),
            "slowest_fps": round(self.slowest_fps, 2),
        }


class Meter:
    """Every result's finish time, age and stream, in a ring; `window` reads a span."""

    def __init__(self, size: int = RING) -> None:
        self._done = np.zeros(size, dtype=np.float64)  # perf_counter() s
        self._age = np.zeros(size, dtype=np.float64)  # s
        self._stream = np.zeros(size, dtype=np.int32)  # index into _ids
        self._ids: dict[str, int] = {}
        self._n = 0
        self._lock = threading.Lock()

    def __call__(self, result: FrameResult) -> None:
        """The outputs' subscriber, on the stream's worker thread."""
        with self._lock:
            i = self._n % len(self._done)
            self._done[i] = result.done_mono
            self._age[i] = result.done_mono - result.capture_mono
            sid = self._ids.get(result.stream_id)
            if sid is None:
                sid = self._ids[result.stream_id] = len(self._ids)
            self._stream[i] = sid
            self._n += 1

    def window(self, start: float, end: float, streams: list[str], offered_fps: float) -> Window:
        """The results finished in [start, end) (perf_counter seconds) of `streams`."""
        with self._lock:
            n = min(self._n, len(self._done))
            done, age, sid = self._done[:n].copy(), self._age[:n].copy(), self._stream[:n].copy()
            ids = dict(self._ids)
        inside = (done >= start) & (done < end)
        seconds = max(end - start, 1e-9)
        rates = {
            s: float(np.count_nonzero(inside & (sid == ids[s]))) / seconds if s in ids else 0.0
            for s in streams
        }
        ages = age[inside] * 1000.0
        p50, p99 = np.percentile(ages, (50, 99)) if ages.size else (float("inf"),) * 2
        return Window(
            seconds=seconds,
            frames=int(ages.size),
            fps=ages.size / seconds,
            p50_ms=float(p50),
            p99_ms=float(p99),
            offered_fps=offered_fps,
            slowest_fps=min(rates.values(), default=0.0),
            streams=rates,
        )

    @staticmethod
    def now() -> float:
        return time.perf_counter()
