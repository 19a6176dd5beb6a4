"""One thread per model that batches samples from many streams into one `session.run`.

Semantics are Triton's dynamic batching: a batch is dispatched as soon as
`max_batch_size` samples wait, or when the oldest has waited `max_queue_delay_ms`
(0: whatever is waiting now, no wait). One rule more, which Triton cannot have: the
batcher knows its producers (the streams holding the model, `set_producers`), and once
every one of them has a sample waiting no other sample can come, so it dispatches at
once instead of waiting out the delay: one stream never waits for company.

Only samples of one shape and dtype share a batch; the oldest sample's shape goes first,
so no shape starves. A model with a fixed batch dimension k is fed exactly-k chunks,
zero-padded, the padded outputs discarded.

The per-sample cost is one `Future`, one tuple and a deque append: ONNX Runtime releases
the GIL in `session.run`, so the stream threads keep preparing frames meanwhile.

Each batch runs on the model's session, unless a `SessionChooser` is set and picks another
for it (a profiling window samples batches onto a profiled twin: appliance/profiling/
sampling.py). Without one, a batch pays one attribute check for the possibility.

Inline (`batching.inline`): when nothing can batch with a sample (the model has one
producer, or `max_batch_size` is 1) and the model is idle (nothing queued or taken, no
run in flight), `submit` runs it on the caller's own thread and returns completed
futures: two thread hand-offs less per frame (worker -> batcher -> worker). Otherwise it
queues as above, so a caller never waits behind a queue and one stream's samples keep
their order. The run is the same as on the thread: one at a time per model (the run
lock), the chooser asked, fixed batches padded, `on_batch` told (`BatchRecord.inline`).
"""

from __future__ import annotations

import itertools
import logging
import threading
from collections import Counter, deque
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from time import perf_counter, thread_time_ns
from types import TracebackType
from typing import NamedTuple

import numpy as np

from appliance.models.batches import BatchRecord, ModelRunError, ModelStoppedError, SessionChooser
from appliance.models.errors import describe_ort_error
from appliance.models.session import LoadedModel
from appliance.models.threads import count_run_cpu, session_threads, threads_cpu_ns
from pipelines.models import ModelInfo, Tensor
from pipelines.shared_runs import SharedRuns
from pipelines.spec import BatchingSpec

__all__ = ["BatchRecord", "ModelBatcher", "ModelRunError", "ModelStoppedError", "SessionChooser"]

logger = logging.getLogger("appliance.models")

Outputs = Sequence[Tensor]
# (sample, stream_id, submitted at perf_counter s, future): a plain tuple, the cheapest record.
_Pending = tuple[Tensor, str, float, Future[Outputs]]


class _Outcome(NamedTuple):
    """One `session.run`: its outputs, or the exception it raised."""

    outputs: Sequence[Tensor]  # () when it failed
    error: Exception | None
    run_start: float  # perf_counter seconds
    run_s: float
    cpu_s: float  # the run's CPU: its calling thread's and its session's pool's
    sampled: bool  # on the session the chooser picked


class ModelBatcher:
    """A `pipelines.models.ModelHandle` over one shared ONNX Runtime session.

    `on_batch`, if set, is called after each `session.run` and before that run's futures
    resolve, on the thread that ran it (the batcher's, or the submitter's for an inline
    run: two may overlap); it must be cheap, thread-safe and must not raise.
    """

    _serials = itertools.count(1)  # next() is atomic: batchers made on any thread

    def __init__(
        self,
        model: LoadedModel,
        batching: BatchingSpec,
        on_batch: Callable[[BatchRecord], None] | None = None,
    ) -> None:
        self.on_batch = on_batch
        # Each run's own CPU (BatchRecord.cpu_s), what the regression watch judges a
        # model's cost by: two clock reads a thread of the run. Off: cpu_s is 0.
        self.measure_cpu = True
        self._model = model
        self._chooser: SessionChooser | None = None  # None: every batch on the model's
        # One session.run at a time (the thread's or an inline one); a swap waits for it.
        self._run_lock = threading.Lock()
        self._batching = batching
        self._max_batch = batching.max_batch_size
        self._delay_s = batching.max_queue_delay_ms / 1000.0
        self._chunk = model.info.input.fixed_batch  # None: any batch size
        self._queue: deque[_Pending] = deque()
        self._waiting: Counter[str] = Counter()  # stream id -> its samples in the queue
        self._producers = 0  # streams that may submit; 0: unknown, wait out the delay
        self._cond = threading.Condition()
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._serve, name=f"batch:{model.id}")
        self._buffer: Tensor | None = None  # last batch array, reused while shapes match
        self._batches = 0
        self._samples = 0
        self.serial = next(ModelBatcher._serials)  # tells this batcher's records apart
        # Runs of one frame's image that a shadow's workflow shares with the live one's
        # (pipelines/shared_runs.py): on while the pool says a shadow leases this model.
        self.shared = SharedRuns()
        # The thread has taken samples and not yet run them all: an inline run now could
        # overtake a stream's earlier sample. Set before the queue is emptied.
        self._busy = False
        self._inline = False  # may a submit run inline now (`_update_inline`)
        self._update_inline()

    @property
    def info(self) -> ModelInfo:
        return self._model.info

    @property
    def batching(self) -> BatchingSpec:
        return self._batching

    @property
    def model(self) -> LoadedModel:
        return self._model

    @property
    def chooser(self) -> SessionChooser | None:
        """What picks each batch's session, when something other than the model does."""
        return self._chooser

    def retune(self, batching: BatchingSpec, model: LoadedModel | None = None) -> None:
        """Take `batching` from the next batch on, and run on `model` (the same file
        opened with other session options: appliance tune) once the batch in flight
        ends. Nothing waiting is dropped; the old session goes when its last run ends."""
        with self._cond:
            self._batching = batching
            self._max_batch = batching.max_batch_size
            self._delay_s = batching.max_queue_delay_ms / 1000.0
            self._update_inline()
            self._cond.notify()  # a smaller batch or delay may make one due now
        if model is not None:
            with self._run_lock:
                self._model = model

    def choose_sessions(self, chooser: SessionChooser | None) -> None:
        """Let `chooser` pick each batch's session from the next batch on, or run every
        batch on the model's own again with None; returns once the batch in flight has
        ended, so no batch runs on a session the previous chooser picked."""
        with self._run_lock:
            self._chooser = chooser

    @property
    def batches(self) -> int:
        """`session.run` calls so far."""
        return self._batches

    @property
    def samples(self) -> int:
        """Samples run so far (padding not counted); samples / batches = mean batch size."""
        return self._samples

    def start(self) -> None:
        """Start the batcher thread; samples submitted before are served then."""
        self._thread.start()

    def stop(self, timeout: float = 2.0) -> bool:
        """Stop the thread: waiting samples (and later submits) fail with
        `ModelStoppedError`; the batch already running finishes. Joins for `timeout` s;
        returns False if the thread is still busy then."""
        self._close("batcher stopped")
        if self._thread.ident is None:
            return True  # never started
        self._thread.join(timeout)
        if self._thread.is_alive():
            logger.warning("model %r: batch thread still busy after %.1fs", self._model.id, timeout)
            return False
        return True

    def set_producers(self, count: int) -> None:
        """How many streams may submit now (the model pool's leases): once that many
        distinct streams have a sample waiting, the batch goes without waiting."""
        with self._cond:
            self._producers = count
            self._update_inline()
            self._cond.notify()

    def _update_inline(self) -> None:
        """Whether a submit may run inline: nothing can batch with its samples (one
        producer; 0 is unknown, so not one) and the batcher is not stopped. Kept in one
        attribute, so a submit decides with one read. Holds the lock (or in __init__)."""
        batching = self._batching
        alone = self._producers == 1 or batching.max_batch_size == 1
        self._inline = batching.inline and alone and not self._stopped.is_set()

    def submit(self, sample: Tensor, stream_id: str = "") -> Future[Outputs]:
        """Queue one sample (no batch dimension); the future holds its outputs, in the
        model's output order, without the batch dimension."""
        return self.submit_many((sample,), stream_id)[0]

    def submit_many(self, samples: Sequence[Tensor], stream_id: str = "") -> list[Future[Outputs]]:
        """Queue several samples of one stream at once (a frame's crops): they are
        seen together, so the early dispatch cannot split them. Inline (see the top),
        they run now as one batch (or chunks of `max_batch_size`, or the fixed batch)."""
        for sample in samples:
            if not isinstance(sample, np.ndarray):
                raise TypeError(f"sample must be a numpy array, got {type(sample).__name__}")
        futures: list[Future[Outputs]] = [Future() for _ in samples]
        if self._inline and self._run_inline(samples, stream_id, futures):
            return futures
        with self._cond:
            if self._stopped.is_set():
                for future in futures:
                    future.set_exception(ModelStoppedError(f"model {self._model.id!r}: stopped"))
                return futures
            now = perf_counter()
            pending = zip(samples, futures, strict=True)
            self._queue.extend((s, stream_id, now, f) for s, f in pending)
            first = self._waiting[stream_id] == 0
            self._waiting[stream_id] += len(samples)
            waiting = len(self._queue)
            # Wake the thread only when it has something new to decide: a first sample
            # (it sleeps without a deadline), a full batch or every producer waiting (it
            # sleeps until the deadline).
            if (
                waiting == len(samples)
                or waiting >= self._max_batch
                or (first and len(self._waiting) >= self._producers > 0)
            ):
                self._cond.notify()
        return futures

    def __enter__(self) -> ModelBatcher:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def _close(self, reason: str) -> None:
        """Refuse new samples and fail the waiting ones."""
        with self._cond:
            self._stopped.set()
            self._update_inline()
            pending = list(self._queue)
            self._queue.clear()
            self._waiting.clear()
            self._cond.notify_all()
        error = ModelStoppedError(f"model {self._model.id!r}: {reason}")
        for item in pending:
            _fail(item[3], error)

    def _serve(self) -> None:
        try:
            while (batch := self._next_batch()) is not None:
                chunk = self._chunk or len(batch)  # len 0 when every future was cancelled
                for start in range(0, len(batch), max(1, chunk)):
                    self._run(batch[start : start + chunk], chunk)
                self._busy = False  # its runs are over: inline runs cannot overtake them
        except BaseException:  # a bug here must not leave every stream waiting forever
            self._close("batch thread crashed")
            raise

    def _next_batch(self) -> list[_Pending] | None:
        """Block until a batch is due; None once stopped."""
        queue = self._queue
        with self._cond:
            while not self._stopped.is_set():
                if len(queue) >= self._max_batch:
                    return self._take()
                if queue and len(self._waiting) >= self._producers > 0:
                    return self._take()  # every producer waits: no sample can join
                if queue:
                    wait_s = queue[0][2] + self._delay_s - perf_counter()
                    if wait_s <= 0:
                        return self._take()
                    self._cond.wait(wait_s)
                else:
                    self._cond.wait()
        return None

    def _take(self) -> list[_Pending]:
        """Up to max_batch_size waiting samples shaped like the oldest, in submit order;
        the others keep their places. Cancelled futures are dropped. Holds the lock."""
        self._busy = True  # before the queue empties: a submit sees one or the other
        queue = self._queue
        shape, dtype = queue[0][0].shape, queue[0][0].dtype
        taken: list[_Pending] = []
        kept: list[_Pending] = []
        waiting = self._waiting
        while queue and len(taken) < self._max_batch:
            item = queue.popleft()
            sample = item[0]
            if sample.shape != shape or sample.dtype != dtype:
                kept.append(item)
                continue
            waiting[item[1]] -= 1  # taken or cancelled: out of the queue either way
            if not waiting[item[1]]:
                del waiting[item[1]]
            if item[3].set_running_or_notify_cancel():
                taken.append(item)
        queue.extendleft(reversed(kept))
        return taken

    def _run(self, items: list[_Pending], size: int) -> None:
        """One `session.run` over `items` on the batcher thread, zero-padded to `size`."""
        with self._run_lock:  # an inline run or a session swap may hold it
            outcome = self._session_run(items, size)
        self._finish(items, outcome, inline=False)

    def _run_inline(
        self, samples: Sequence[Tensor], stream_id: str, futures: list[Future[Outputs]]
    ) -> bool:
        """Run `samples` now on the caller's thread if the model is idle; False (nothing
        done) when a sample waits or is taken (it may be this stream's and must run
        first) or a run holds the lock: then they queue, never wait for it."""
        if self._queue or self._busy or not self._run_lock.acquire(blocking=False):
            return False
        try:
            items = [(s, stream_id, 0.0, f) for s, f in zip(samples, futures, strict=True)]
            done = [(chunk, self._session_run(chunk, size)) for chunk, size in self._chunks(items)]
        finally:
            self._run_lock.release()
        for chunk, outcome in done:
            self._finish(chunk, outcome, inline=True)
        return True

    def _chunks(self, items: list[_Pending]) -> list[tuple[list[_Pending], int]]:
        """One stream's samples as the thread would run them: runs of one shape and
        dtype, at most max_batch_size (and the fixed batch) each; (chunk, padded size)."""
        limit = min(self._max_batch, self._chunk or self._max_batch)
        out: list[tuple[list[_Pending], int]] = []
        start = 0
        for end in range(1, len(items) + 1):
            full = end == len(items) or end - start == limit
            if full or not _alike(items[end][0], items[start][0]):
                out.append((items[start:end], self._chunk or end - start))
                start = end
        return out

    def _session_run(self, items: list[_Pending], size: int) -> _Outcome:
        """Stack and run `items` on the session the chooser picks (the model's own
        without one). Holds the run lock: the shared stacking buffer is safe too."""
        model = self._model
        pool: frozenset[int] = frozenset()  # the session's intra-op threads, once known
        pool_start, caller_start = 0, thread_time_ns()
        run_start = perf_counter()
        sampled = False
        outputs: Sequence[Tensor] = ()
        error: Exception | None = None
        try:
            batch = self._stack([item[0] for item in items], size)
            session, chooser = model.session, self._chooser
            if chooser is not None and (chosen := chooser.session_for_batch()) is not None:
                session, sampled = chosen, True
            if self.measure_cpu:
                pool = session_threads(session)
                pool_start, caller_start = threads_cpu_ns(pool), thread_time_ns()
            run_start = perf_counter()
            outputs = session.run(model.output_names, {model.input_name: batch})
        except Exception as exc:  # ORT's errors share no base but Exception; fail this batch
            error = exc
        run_s = perf_counter() - run_start
        # Read after the wall clock: the CPU clocks (about 1 µs each) are not the run's time.
        cpu_ns = 0
        if self.measure_cpu:
            caller_ns = thread_time_ns() - caller_start
            count_run_cpu(caller_ns)  # not the calling block's own cost (inline runs)
            cpu_ns = caller_ns + threads_cpu_ns(pool) - pool_start
        cpu_s = cpu_ns / 1e9
        outcome = _Outcome(outputs, error, run_start, run_s, cpu_s, sampled)
        # Counted once the run is over (as `on_batch` is told right after): a reader that
        # sees `batches` grow sees a finished run.
        self._batches += 1
        self._samples += len(items)
        return outcome

    def _finish(self, items: list[_Pending], outcome: _Outcome, inline: bool) -> None:
        """Tell `on_batch`, then resolve the run's futures (its error fails them all)."""
        self._record(items, outcome, inline)
        if outcome.error is not None:
            reason = describe_ort_error(outcome.error)
            error = ModelRunError(f"model {self._model.id!r}: {reason}")
            for item in items:
                _fail(item[3], error)
            return
        # zip(*outputs) yields per-row views (out0[i], out1[i], ...); padded rows are left.
        for item, result in zip(items, zip(*outcome.outputs, strict=False), strict=False):
            item[3].set_result(result)

    def _stack(self, samples: list[Tensor], size: int) -> Tensor:
        """Samples as one contiguous (size, *shape) array; rows past them are zeros."""
        first = samples[0]
        if size == 1 and first.flags.c_contiguous:
            # One sample (a lone stream's frame): a view with the batch axis, no copy. A
            # 640x480 float32 frame is 3.7 MB: 0.3 ms of copying on the batcher's path.
            return first[None]
        shape = (size, *first.shape)
        buffer = self._buffer
        if buffer is None or buffer.shape != shape or buffer.dtype != first.dtype:
            buffer = self._buffer = np.empty(shape, first.dtype)
        np.stack(samples, out=buffer[: len(samples)])
        if len(samples) < size:
            buffer[len(samples) :] = 0
        return buffer

    def _record(self, items: list[_Pending], outcome: _Outcome, inline: bool) -> None:
        hook = self.on_batch
        if hook is None:
            return
        run_start = outcome.run_start
        record = BatchRecord(
            model_id=self._model.id,
            batch_size=len(items),
            stream_ids=tuple(item[1] for item in items),
            queue_wait_s=(0.0,) * len(items)
            if inline
            else tuple(run_start - item[2] for item in items),
            run_start=run_start,
            run_s=outcome.run_s,
            cpu_s=outcome.cpu_s,
            ok=outcome.error is None,
            queue_depth=len(self._queue),
            ort_profiled=outcome.sampled,
            inline=inline,
            batcher=self.serial,
        )
        try:
            hook(record)
        except Exception:  # a broken profiler must not stop inference
            logger.exception("model %r: on_batch hook failed", self._model.id)


def _fail(future: Future[Outputs], error: BaseException) -> None:
    if not future.done():
        future.set_exception(error)


def _alike(a: Tensor, b: Tensor) -> bool:
    """May share a batch: one shape and dtype."""
    return a.shape == b.shape and a.dtype == b.dtype
