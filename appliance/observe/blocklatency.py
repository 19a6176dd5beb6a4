"""Each stream's recent per-block latency, for `GET /v1/streams/{id}/latency` and the web
viewer: what the Prometheus histograms hold too, but as exact percentiles over the last
frames of one stream, readable without a scraper.

One preallocated ring per stream (frames × blocks, seconds; NaN for a block skipped on
that frame), written on the stream's worker thread by an in-process subscriber of the
outputs: a row of float stores per frame, nothing allocated. Percentiles are computed
only when someone asks (np.nanpercentile over a copy). A stream's ring is attached when
the stream starts and detached when it stops, so a restart or a reload starts a fresh
window on the workflow it now runs.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from appliance.errors import UnknownStreamError
from appliance.observe.slowest import LastBatches, SlowestFrames, SlowFrame
from pipelines.types import FrameResult

WINDOW = 256  # frames: about 17 s at 15 fps, enough for a stable p99


@dataclass(frozen=True, slots=True)
class Percentiles:
    """Over the frames of the window the span ran in; None before the first."""

    p50_ms: float | None
    p99_ms: float | None


@dataclass(frozen=True, slots=True)
class BlockLatency:
    """One block of the workflow; `frames`: how many frames of the window ran it."""

    id: str
    type: str
    frames: int
    p50_ms: float | None
    p99_ms: float | None


@dataclass(frozen=True, slots=True)
class StreamLatency:
    """A stream's recent latency: the whole workflow run and each block, in workflow
    order, over its last `frames` results (at most `window`); `fps`: their rate."""

    stream: str
    window: int
    frames: int
    fps: float | None
    workflow: Percentiles
    blocks: list[BlockLatency]


class LatencyRing:
    """The last `size` frames of one stream; called on its worker thread with each result."""

    def __init__(self, stream_id: str, blocks: Sequence[tuple[str, str]], size: int = WINDOW):
        self.stream_id = stream_id
        self.blocks = tuple(blocks)  # (id, type) in workflow order
        # Column 0: the whole workflow run; then one column per block.
        self._spans = np.full((size, len(self.blocks) + 1), np.nan, dtype=np.float64)
        self._done = np.zeros(size, dtype=np.float64)  # each frame's end, perf_counter()
        self._n = 0
        self._lock = threading.Lock()  # a reader never sees a row half written

    def __call__(self, result: FrameResult) -> None:
        spans = result.block_spans
        if len(spans) != len(self.blocks):
            return  # a result of the workflow this stream ran before a restart
        with self._lock:
            i = self._n % self._done.size
            row = self._spans[i]
            row[0] = result.done_mono - result.start_mono
            for col, span in enumerate(spans, 1):
                row[col] = math.nan if span is None else span[1] - span[0]
            self._done[i] = result.done_mono
            self._n += 1

    def report(self) -> StreamLatency:
        with self._lock:
            frames = min(self._n, self._done.size)
            spans = self._spans[:frames].copy()
            done = self._done[:frames].copy()
        ms = [_percentiles(spans[:, col] * 1000.0) for col in range(spans.shape[1])]
        ran = np.count_nonzero(~np.isnan(spans), axis=0)
        blocks = [
            BlockLatency(block_id, block_type, int(ran[col]), *ms[col])
            for col, (block_id, block_type) in enumerate(self.blocks, 1)
        ]
        return StreamLatency(
            self.stream_id, self._done.size, frames, _rate(done), Percentiles(*ms[0]), blocks
        )


class BlockLatencies:
    """Every running stream's ring and slowest frames (appliance/observe/slowest.py): the
    runtime subscribes this to the outputs once and attaches a stream's when it starts,
    detaches them when it stops. `batches` is told every model run (the pool's hook)."""

    def __init__(self, size: int = WINDOW) -> None:
        self._size = size
        self._rings: dict[str, tuple[LatencyRing, SlowestFrames]] = {}
        self.batches = LastBatches()

    def __call__(self, result: FrameResult) -> None:
        """The subscriber: on the stream's worker thread, with each of its results."""
        found = self._rings.get(result.stream_id)
        if found is not None:
            ring, slowest = found
            ring(result)
            slowest(result)

    def attach(self, stream_id: str, blocks: Sequence[tuple[str, str]]) -> None:
        """A fresh window for a stream that starts (again) with these (id, type) blocks."""
        ring = LatencyRing(stream_id, blocks, self._size)
        self._rings[stream_id] = ring, SlowestFrames(stream_id, blocks, self.batches)

    def detach(self, stream_id: str) -> None:
        self._rings.pop(stream_id, None)

    def slowest(self, stream_id: str, since_wall: float, limit: int) -> list[SlowFrame]:
        """The stream's `limit` slowest frames captured since `since_wall` (epoch s)."""
        found = self._rings.get(stream_id)
        if found is None:
            raise UnknownStreamError(stream_id)
        return found[1].report(since_wall, limit)

    def report(self, stream_id: str) -> StreamLatency:
        """The stream's recent latency; UnknownStreamError if no stream runs with that id."""
        found = self._rings.get(stream_id)
        if found is None:
            raise UnknownStreamError(stream_id)
        return found[0].report()


def _percentiles(values_ms: np.ndarray) -> tuple[float | None, float | None]:
    ran = values_ms[~np.isnan(values_ms)]
    if ran.size == 0:
        return None, None  # never ran in the window (np.nanpercentile would warn)
    p50, p99 = np.percentile(ran, (50, 99))
    return round(float(p50), 3), round(float(p99), 3)


def _rate(done: np.ndarray) -> float | None:
    """Results per second between the first and the last of the window."""
    if done.size < 2:
        return None
    elapsed = float(done.max() - done.min())
    return round((done.size - 1) / elapsed, 2) if elapsed > 0 else None
