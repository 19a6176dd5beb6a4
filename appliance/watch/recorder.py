"""What the regression watch samples: each stream's frames (its workflow run, frame age and
every block) and each model's batches (`session.run`, queue waits), in fixed rings.

Written on the thread that made the data (a stream's worker, a model's batcher): one row of
integer stores per frame or batch under a lock, nothing allocated, so the per-frame cost is
a few µs. The watch thread `take`s what came since its last look, at most the ring's size (a
uniform sample of the interval when more came: the ring keeps the newest, so the newest
`size` of a long interval; the ring holds at least `window_samples`).

Samples are whole µs (what trace files hold: `trace diff` ranks the same numbers). A frame
recorded before `skip_until` (a warm-up after a start, or a profiling window that runs: the
profiler's own cost is not the workflow's) is dropped.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from appliance.models.batcher import BatchRecord
from pipelines.types import FrameResult

Samples = npt.NDArray[np.int64]
SKIPPED = -1  # a block that did not run on that frame (gated by rate_limit, a branch)
FRAME, AGE = 0, 1  # the first two columns of a stream's ring; then one per block (its
# latency), then one per block again (its thread CPU time: its own cost)


class Ring:
    """The last `size` rows of `width` µs values; `take` answers the rows since its last
    call (each column without SKIPPED values)."""

    def __init__(self, width: int, size: int) -> None:
        self._rows = np.full((size, width), SKIPPED, dtype=np.int64)
        self._n = 0
        self._taken = 0
        self._lock = threading.Lock()

    def put(self, values: Sequence[int]) -> None:
        with self._lock:
            self._rows[self._n % len(self._rows)] = values
            self._n += 1

    def take(self) -> list[Samples]:
        """Per column, the values written since the last take (at most `size` rows)."""
        with self._lock:
            new = min(self._n - self._taken, len(self._rows))
            index = np.arange(self._n - new, self._n) % len(self._rows)
            rows = self._rows[index]  # a copy (fancy indexing)
            self._taken = self._n
        return [col[col != SKIPPED] for col in rows.T]


class StreamRecorder:
    """One stream's frames: the outputs' subscriber calls it on the stream's worker."""

    def __init__(self, stream_id: str, block_ids: Sequence[str], size: int) -> None:
        self.stream_id = stream_id
        self.block_ids = tuple(block_ids)
        n = len(self.block_ids)
        self.ring = Ring(2 * n + 2, size)
        self.skip_until = 0.0  # perf_counter(): frames done before are not recorded
        self._row = [SKIPPED] * (2 * n + 2)  # reused: nothing allocated per frame
        self._cpu_col = n + 2  # the first block's CPU column
        self._unmeasured = (0,) * n  # a frame's CPU times when its run did not read them

    def __call__(self, result: FrameResult) -> None:
        spans = result.block_spans
        if result.done_mono < self.skip_until or len(spans) != len(self.block_ids):
            return  # warming up, in a window, or a result of the workflow run before
        row = self._row
        row[FRAME] = round((result.done_mono - result.start_mono) * 1e6)
        row[AGE] = round((result.done_mono - result.capture_mono) * 1e6)
        for col, span in enumerate(spans, 2):
            row[col] = SKIPPED if span is None else round((span[1] - span[0]) * 1e6)
        # ns to whole µs; a skipped block's 0 is no sample, nor a frame not measured
        # (the row is reused: its last frame's values must not stand for this one's)
        for col, ns in enumerate(result.block_cpu_ns or self._unmeasured, self._cpu_col):
            row[col] = ns // 1000 if ns else SKIPPED
        self.ring.put(row)

    def skip(self, seconds: float) -> None:
        """Record nothing for `seconds` from now (or longer, if already skipping)."""
        self.skip_until = max(self.skip_until, time.perf_counter() + seconds)


class ModelRecorder:
    """Every model's batches: its `session.run` and each sample's queue wait, and the
    run's own cost per sample (`BatchRecord.cpu_s` over its batch size: a batch that
    grows with more cameras costs more per run, not per sample)."""

    def __init__(self, size: int, warmup_s: float) -> None:
        self._size = size
        self._warmup_s = warmup_s
        self.runs: dict[str, Ring] = {}
        self.waits: dict[str, Ring] = {}
        self.skip_until: dict[str, float] = {}  # per model, as StreamRecorder.skip_until
        self.paused_until = 0.0  # every model: a profiling window runs

    def __call__(self, rec: BatchRecord) -> None:
        """The pool's on_batch hook, after each run: on the model's batcher thread, or on
        a stream's thread for an inline run."""
        if not rec.ok or rec.ort_profiled:
            return  # a failed run, or one ORT's profiler made slower (about 1.5 times)
        start = rec.run_start
        if start < self.paused_until or start < self.skip_until.get(rec.model_id, 0.0):
            return
        runs = self.runs.get(rec.model_id)
        if runs is None:  # the model's first batch: its warm-up starts now
            self._first_batch(rec.model_id, start)
            return
        cpu = rec.cpu_s  # its own cost; none measured (0): no sample
        own = round(cpu * 1e6 / max(rec.batch_size, 1)) if cpu > 0 else SKIPPED
        runs.put((round(rec.run_s * 1e6), own))
        waits = self.waits[rec.model_id]
        for wait in rec.queue_wait_s:
            waits.put((round(wait * 1e6),))

    def _first_batch(self, model_id: str, now: float) -> None:
        # setdefault: a dict insert is atomic, so two threads (the batcher's and an inline
        # run's) cannot make two rings; Ring.put takes its own lock.
        self.waits.setdefault(model_id, Ring(1, self._size))
        self.runs.setdefault(model_id, Ring(2, self._size))  # run µs, CPU µs per sample
        self.skip_until.setdefault(model_id, now + self._warmup_s)

    def skip(self, model_id: str, seconds: float) -> None:
        self.skip_until[model_id] = time.perf_counter() + seconds
