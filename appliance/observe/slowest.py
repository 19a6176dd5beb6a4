"""Each stream's slowest frames of the last hour, for `GET /v1/streams/{id}/slowest`,
`appliance streams slowest ID` and the web viewer: which frames made a latency spike,
what each block and model wait cost them, and the link to each one's trace.

Memory is bounded per stream: one slot a minute (SLOT_S) for the last SLOTS minutes,
each keeping its PER_SLOT slowest frames in a min-heap. Per frame, on the stream's
worker thread: a subtraction and a compare against the slot's fastest kept frame; only
a frame that makes it in is copied (its block spans, its model runs). The slowest N of
any period are among the slots' kept frames as long as N <= PER_SLOT.

Each model run a frame waited for comes from the pool's batch records (`LastBatches`,
on the batcher's thread): per stream and model, the latest run, taken for a frame only
when it started within the frame's workflow run.
"""

from __future__ import annotations

import heapq
import itertools
import math
import threading
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

from appliance.models.batches import BatchRecord
from pipelines.types import FrameResult, iso_utc

SLOT_S = 60.0  # one slot a minute
SLOTS = 60  # the last hour
PER_SLOT = 10  # frames kept a minute: `limit` is at most this
DEFAULT_SINCE_S = 3600.0


@dataclass(frozen=True, slots=True)
class ModelWait:
    """A model run a frame waited for: its batch, the frame's wait in the queue."""

    model: str
    batch_size: int
    queue_ms: float
    run_ms: float


@dataclass(frozen=True, slots=True)
class BlockTime:
    id: str
    type: str
    ms: float | None  # None: skipped on this frame


@dataclass(frozen=True, slots=True)
class SlowFrame:
    """One slow frame: `total_ms` its workflow run, `age_ms` capture to result."""

    seq: int
    at: str  # when it was captured, ISO 8601 UTC
    total_ms: float
    age_ms: float
    slowest_block: str | None
    blocks: list[BlockTime]
    models: list[ModelWait]
    batch_size: int | None  # the largest batch it was run in (None: no model)
    queue_wait_ms: float  # its waits in models' queues, together
    trace: str  # its trace: GET this path


@dataclass(frozen=True, slots=True)
class SlowestReport:
    stream: str
    since: str
    frames: list[SlowFrame]
    kept_per_minute: int = PER_SLOT
    window_s: float = SLOT_S * SLOTS


# (model -> (batch size, wait s, run start perf_counter s, run s)) per stream
_Run = tuple[int, float, float, float]


class LastBatches:
    """The latest run of each model for each stream: the pool's `on_batch` tells it."""

    def __init__(self) -> None:
        self.runs: dict[str, dict[str, _Run]] = {}

    def __call__(self, rec: BatchRecord) -> None:
        for stream, wait in zip(rec.stream_ids, rec.queue_wait_s, strict=False):
            runs = self.runs.get(stream)
            if runs is None:
                runs = self.runs[stream] = {}
            runs[rec.model_id] = (rec.batch_size, wait, rec.run_start, rec.run_s)

    def during(self, stream: str, start: float, end: float) -> list[ModelWait]:
        """The runs of the stream's frame that ran from `start` to `end` (perf_counter)."""
        out = []
        for model, (size, wait, run_start, run_s) in list(self.runs.get(stream, {}).items()):
            if start <= run_start <= end:
                out.append(ModelWait(model, size, round(wait * 1e3, 3), round(run_s * 1e3, 3)))
        return out


class _Kept:
    """A frame in a slot's heap: the numbers it needs, not the frame (no image kept)."""

    __slots__ = ("blocks", "models", "result_age", "seq", "spans", "start", "when")

    def __init__(self, result: FrameResult, models: list[ModelWait]) -> None:
        self.seq, self.when = result.seq, result.capture_time
        self.start, self.result_age = result.start_mono, result.age_seconds
        self.spans = tuple(result.block_spans)
        self.models = models


class SlowestFrames:
    """One stream's slots; called on its worker thread with each result."""

    def __init__(
        self, stream_id: str, blocks: Sequence[tuple[str, str]], batches: LastBatches
    ) -> None:
        self.stream_id = stream_id
        self.blocks = tuple(blocks)
        self._batches = batches
        self._slots: deque[tuple[int, list[tuple[float, int, _Kept]]]] = deque()
        self._tie = itertools.count()  # heap order for equal times: never compares _Kept
        self._lock = threading.Lock()

    def __call__(self, result: FrameResult) -> None:
        total = result.done_mono - result.start_mono
        slot = int(result.done_mono // SLOT_S)
        slots = self._slots
        if not slots or slots[-1][0] != slot:
            with self._lock:
                slots.append((slot, []))
                while len(slots) > SLOTS:
                    slots.popleft()
        heap = slots[-1][1]
        if len(heap) >= PER_SLOT and total <= heap[0][0]:
            return  # the common case: faster than every frame kept this minute
        models = self._batches.during(self.stream_id, result.start_mono, result.done_mono)
        kept = _Kept(result, models)
        with self._lock:
            item = (total, next(self._tie), kept)
            if len(heap) < PER_SLOT:
                heapq.heappush(heap, item)
            else:
                heapq.heapreplace(heap, item)

    def report(self, since_wall: float, limit: int) -> list[SlowFrame]:
        """The `limit` slowest frames captured at or after `since_wall` (epoch s)."""
        with self._lock:
            kept = [item for _, heap in self._slots for item in heap]
        kept = [item for item in kept if item[2].when >= since_wall]
        kept.sort(key=lambda item: item[0], reverse=True)
        return [self._row(total, k) for total, _, k in kept[:limit]]

    def _row(self, total: float, kept: _Kept) -> SlowFrame:
        blocks = [
            BlockTime(bid, btype, None if span is None else round((span[1] - span[0]) * 1e3, 3))
            for (bid, btype), span in zip(self.blocks, kept.spans, strict=False)
        ]
        ran = [b for b in blocks if b.ms is not None]
        slowest = max(ran, key=lambda b: b.ms or 0.0).id if ran else None
        sizes = [m.batch_size for m in kept.models]
        return SlowFrame(
            seq=kept.seq,
            at=iso_utc(kept.when),
            total_ms=round(total * 1e3, 3),
            age_ms=round(kept.result_age * 1e3, 3),
            slowest_block=slowest,
            blocks=blocks,
            models=kept.models,
            batch_size=max(sizes) if sizes else None,
            queue_wait_ms=round(math.fsum(m.queue_ms for m in kept.models), 3),
            trace=f"/v1/streams/{self.stream_id}/frames/{kept.seq}/trace",
        )
