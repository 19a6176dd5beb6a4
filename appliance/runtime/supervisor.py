"""The supervisor: one thread, `supervise`, that finds streams which stopped producing.

uvicorn's multiprocess supervisor pings its workers and replaces a hung one. Ours reads
the heartbeats that every stream's threads keep (appliance/runtime/streams.py) and applies three
rules, each pass:

- a worker busy on one frame for longer than `stall_s` (limits.worker_stall_s) is stuck
  in a call that does not return (a block, a model that never answers);
- a grabber inside one read for longer is stuck too: the source's own timeouts
  (`stall_timeout_s`, FFmpeg's) should have ended that read long before;
- a worker thread that ended without finishing died of an exception outside the workflow
  (restarted at most once per `stall_s`: a worker that dies at once must not spin).

Such a stream is marked `stalled` and handed to `on_stalled` (the runtime restarts it).
A pass reads a few floats per stream; the stuck thread's stack is read only when a stall
is found, to name the block it is stuck in.
"""

from __future__ import annotations

import logging
import sys
import threading
import time
from collections.abc import Callable, Iterable, Sequence

from prometheus_client import Counter

from appliance.runtime.streams import Stream
from pipelines.executor import WorkflowRun

log = logging.getLogger("appliance.supervisor")

MAX_INTERVAL_S = 1.0  # a stall is seen within stall_s + 1 s at the default bound
CHECKS_PER_BOUND = 4  # a short bound (1 s in tests) is still checked 4 times within it
# A pass that restarts a stream waits for its grabber (up to 3 s) and may compile its
# workflow again; a minute without a pass means the thread is wedged, and /health says so.
STALE_AFTER_S = 60.0

StallHandler = Callable[[Stream, str], None]

# The executor's per-frame loops. Each appends one span per block it has run, so while a
# block runs, the count of spans is its index: naming the block costs the hot path nothing.
_EXECUTOR_LOOPS = frozenset(
    {
        WorkflowRun._run_plain.__code__,
        WorkflowRun._run_gated.__code__,
        WorkflowRun._run_timed.__code__,
    }
)


class Supervisor:
    """Checks `streams()` every `interval_s` on its thread; `start` once, `stop` once."""

    def __init__(
        self, streams: Callable[[], Iterable[Stream]], on_stalled: StallHandler, stall_s: float
    ) -> None:
        self.stall_s = stall_s
        self.interval_s = min(MAX_INTERVAL_S, stall_s / CHECKS_PER_BOUND)
        self._streams = streams
        self._on_stalled = on_stalled
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="supervise", daemon=True)
        self._last_pass = 0.0  # time.perf_counter() of the latest pass: its own heartbeat

    def start(self) -> None:
        self._last_pass = time.perf_counter()
        self._thread.start()

    def stop(self, timeout: float = 2.0) -> bool:
        """End the thread (a restart in progress finishes first); True when it ended."""
        self._stop.set()
        if self._thread.ident is None:
            return True
        self._thread.join(timeout)
        return not self._thread.is_alive()

    @property
    def problem(self) -> str | None:
        """None while the thread runs and passes; else why it does not."""
        if self._thread.ident is None:
            return "not started"
        if not self._thread.is_alive():
            return "stopped"
        silent = time.perf_counter() - self._last_pass
        return f"stuck: no check for {silent:.0f} s" if silent > STALE_AFTER_S else None

    def check(self) -> None:
        """One pass over every stream (the thread runs it every `interval_s`)."""
        self._last_pass = now = time.perf_counter()
        for stream in list(self._streams()):
            try:
                reason = stall_reason(stream, now, self.stall_s)
                if reason is not None and stream.mark_stalled(reason):
                    self._on_stalled(stream, reason)
            except Exception:  # one stream's bug must not end the supervision of all
                log.exception("supervising stream %s failed", stream.id)

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.check()


def stall_reason(stream: Stream, now: float, bound_s: float) -> str | None:
    """Why `stream` counts as stalled at `now` (time.perf_counter() s), or None."""
    beat = stream.heartbeat()
    limit = f"limits.worker_stall_s is {bound_s:g} s"
    if beat.working_since and now - beat.working_since > bound_s:
        block = running_block(beat.worker, stream.workflow.block_ids)
        where = f" in block {block!r}" if block else ""
        return f"worker stuck{where} for {now - beat.working_since:.1f} s ({limit})"
    if beat.reading_since and now - beat.reading_since > bound_s:
        return f"grabber stuck in one read of the source for {now - beat.reading_since:.1f} s"
    if beat.worker_died and now - beat.started > bound_s:
        return "worker thread ended unexpectedly (its traceback is in the log)"
    return None


def running_block(thread_id: int | None, block_ids: Sequence[str]) -> str | None:
    """The block the thread `thread_id` is running now, from its stack; None if it is not
    inside a workflow (or the executor changed shape: then the stall goes unnamed)."""
    frame = sys._current_frames().get(thread_id) if thread_id is not None else None
    while frame is not None and frame.f_code not in _EXECUTOR_LOOPS:
        frame = frame.f_back
    if frame is None:
        return None
    spans = frame.f_locals.get("spans")
    if isinstance(spans, list) and len(spans) < len(block_ids):
        return block_ids[len(spans)]
    return None


MAX_STALL_RESTARTS = 3  # restarts in a row of a stream that stalls before any frame


def restart_stalled(stream: Stream, restart: Callable[[str], Stream], abandoned: Counter) -> None:
    """The runtime's answer to a stall: restart the stream (a fresh worker, maybe a fresh
    source: that is what helps) and abandon its stuck thread, at most MAX_STALL_RESTARTS
    times in a row without a processed frame."""
    if stream.stall_streak >= MAX_STALL_RESTARTS:
        # Each restart leaves a stuck thread behind: a call that never returns (a hung
        # GPU, a deadlocked plugin) would leak one per worker_stall_s forever.
        log.error(
            "stream %s: stalled again after %d restarts without a processed frame; "
            "not restarted again (POST /v1/streams/%s/restart once the cause is fixed)",
            stream.id,
            stream.stall_streak,
            stream.id,
        )
        return
    try:
        new = restart(stream.id)
    except Exception:  # a workflow file broken since: the stream stays `stalled`
        log.exception("stream %s: restart after a stall failed; it stays stalled", stream.id)
        return
    new.inherit(stream)
    log.warning("stream %s restarted after a stall", stream.id)
    left = stream.threads_alive()
    if left:
        abandoned.inc(len(left))
        log.warning("stream %s: abandoned stuck thread(s) %s", stream.id, ", ".join(left))
