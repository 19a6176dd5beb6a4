"""A stream: one grabber thread, one worker thread, a lifecycle and its statistics.

The grabber decodes continuously into a one-slot `LatestFrame`; the worker takes the
newest frame, runs the compiled workflow and publishes the result. A slow workflow never
makes frames pile up: frames it had no time for are overwritten and counted as dropped.
Both threads keep a heartbeat (when their current frame or read began) that the
supervisor (appliance/runtime/supervisor.py) reads to find a stream that stopped producing.
"""

from __future__ import annotations

import functools
import itertools
import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from appliance.config import StreamConfig
from appliance.observe.metrics import StreamMetrics
from appliance.observe.stats import LatencyWindow, RateMeter
from appliance.observe.status import Latency, StreamStatus
from appliance.policy.hosts import ANY_HOST, SourceHosts
from appliance.profiling.hooks import StreamTrace
from appliance.runtime.shadow import Shadow
from appliance.runtime.streamparts import Heartbeat, LastError, Switch, Transition, state_name
from appliance.runtime.video import VideoDemand
from appliance.sources import Grabber, StreamState, mask_url, slot_for
from pipelines.executor import CompiledWorkflow, CpuClock, WorkflowRun
from pipelines.types import Detections, Frame, FrameResult, iso_utc

log = logging.getLogger("appliance.streams")
RunFn = Callable[[Frame, bool], FrameResult]
ObserveFn = Callable[[FrameResult], None]

TERMINAL = frozenset({StreamState.STOPPED, StreamState.FAILED})
_TROUBLE = frozenset({StreamState.FAILED, StreamState.RECONNECTING, StreamState.STALLED})
GET_TIMEOUT_S = 0.25  # how often an idle worker re-checks its stop flag


class Stream:
    """Owns a stream's threads; `start` once, `stop` once (idempotent)."""

    def __init__(
        self,
        cfg: StreamConfig,
        workflow: CompiledWorkflow,
        publish: Callable[[FrameResult], None],
        metrics: StreamMetrics,
        resolve_path: Callable[[str], Path],
        *,
        max_frames: int | None = None,
        history: int = 50,
        trace: StreamTrace | None = None,
        on_state: Callable[[str, str, str], None] | None = None,
        hosts: SourceHosts = ANY_HOST,
        cpu_clock: CpuClock | None = None,
        video: VideoDemand | None = None,
    ) -> None:
        self.id = cfg.id
        # Who reads this stream's video: none, and its drawing steps are left out. None:
        # it draws every frame.
        self._video = video
        self._cpu_clock = cpu_clock  # each block's own CPU time too (the regression watch's)
        self.workflow_run: WorkflowRun | None = None  # the worker's, once it started
        # A candidate workflow run on this stream's frames (appliance/runtime/shadows.py).
        self.shadow: Shadow | None = None
        self._switch: Switch | None = None  # another workflow, from the next frame on
        # What ends with the stream (its shadow), by a number each: removed when it ends first.
        self._stop_hooks: dict[int, Callable[[float], bool]] = {}
        self._hook_ids = itertools.count()
        # Told (stream id, state, reason) on each change: the outputs publish it (MQTT).
        self._state_hook = on_state
        self._trace = trace  # the profiler's per-frame hook, on this worker thread
        self.cfg = cfg
        self.url = mask_url(cfg.source.url)
        self.workflow = workflow
        self._publish = publish  # the stream's routes to its sinks (appliance/runtime/outputs.py)
        self.metrics = metrics
        self._max_frames = max_frames
        self._state = StreamState.STARTING
        self._state_lock = threading.Lock()
        self.transitions: deque[Transition] = deque(maxlen=history)
        self._error: LastError | None = None  # replaced whole: read without a lock
        self.slot = slot_for(cfg.source)
        self._grabber = Grabber(
            cfg.id, cfg.source, self.slot, self._on_state, resolve_path, hosts=hosts
        )
        if trace is not None:
            self._grabber.on_grabbed = trace.grabbed
        self._grabber.on_problem = self._on_problem
        self._stop = threading.Event()
        self.done = threading.Event()  # set when the worker has ended
        self._worker = threading.Thread(target=self._work, name=f"work:{cfg.id}", daemon=True)
        self.latency = LatencyWindow()
        self.rate = RateMeter()
        self.age_total = 0.0  # every processed frame's age, summed (s)
        self.failed_frames = 0
        self.detections = 0
        self.last_result_mono = 0.0
        self._dropped_reported = 0
        # Heartbeat: written by the worker only, read by the supervisor without a lock (a
        # float store is atomic); two stores per frame are all it costs the hot path.
        self._working_since = 0.0
        self._started = 0.0  # time.perf_counter() at start()
        # Why this stream (or the one it replaced) stalled, and its frame count then: the
        # stall is over once it processes a frame again.
        self._stall: str | None = None
        # Restarts after a stall in a row, none of them followed by a processed frame.
        self.stall_streak = 0
        self._stall_frames = 0

    # -- lifecycle -----------------------------------------------------------------
    @property
    def state(self) -> StreamState:
        return self._state

    def start(self) -> None:
        self._started = time.perf_counter()
        self._on_state(StreamState.STARTING, f"starting {self.url}")
        self._worker.start()
        self._grabber.start()

    def stop(self, timeout: float = 3.0) -> bool:
        """Stop both threads; True when both ended within `timeout` seconds."""
        deadline = time.monotonic() + timeout
        self._stop.set()
        grabbed = self._grabber.stop(timeout)
        self.slot.close()
        # A stalled worker is stuck in a call that may never return: waiting for it only
        # holds up the restart that replaces it. It is a daemon thread, left to end alone.
        stalled = self._state == StreamState.STALLED
        self._worker.join(0.0 if stalled else max(0.0, deadline - time.monotonic()))
        worker_ended = not self._worker.is_alive()
        for hook in list(self._stop_hooks.values()):  # a hook may remove itself
            hook(max(0.1, deadline - time.monotonic()))
        self.metrics.up.set(0)
        if not grabbed or not (worker_ended or stalled):  # stalled: the supervisor says so
            log.warning("stream %s: threads did not end within %.1f s", self.id, timeout)
        return grabbed and worker_ended

    def on_stop(self, hook: Callable[[float], bool]) -> Callable[[], None]:
        """`hook(seconds left)` is called when the stream stops (its shadow's stop); the
        returned function removes it (what ends before the stream must not stay)."""
        key = next(self._hook_ids)
        self._stop_hooks[key] = hook
        return functools.partial(self._remove_hook, key)

    def _remove_hook(self, key: int) -> None:
        self._stop_hooks.pop(key, None)

    @property
    def last_error(self) -> str | None:
        """The latest error (credentials masked), kept after it cleared; None before one."""
        error = self._error
        return None if error is None else error.reason

    def _set_error(self, reason: str) -> None:
        self._error = LastError(reason, time.time(), self.rate.count)

    def _error_cleared(self, error: LastError) -> bool:
        """Past: the stream processed a frame since, and is in no trouble now."""
        return self.rate.count > error.frames and self._state not in _TROUBLE

    def _on_problem(self, reason: str) -> None:
        """A source problem that changed no state (frames that did not decode)."""
        self._set_error(reason)

    def _on_state(self, state: StreamState, reason: str) -> None:
        """Called by the grabber thread (and start/stop) on every state change."""
        with self._state_lock:
            if self._state == StreamState.STALLED:
                return  # being replaced: later grabber states would hide why
            if state in TERMINAL and self._state == StreamState.FAILED:
                return  # a failure's reason is the one to keep
            changed = state != self._state or not self.transitions
            self._state = state
            if changed or state == StreamState.RECONNECTING:
                self.transitions.append(Transition(time.time(), state, reason))
        if state in _TROUBLE:
            self._set_error(reason)
        if state == StreamState.RECONNECTING:
            self.metrics.reconnects.inc()
        self.metrics.up.set(1 if state == StreamState.RUNNING else 0)
        level = logging.WARNING if state in _TROUBLE else logging.INFO
        if changed or level == logging.WARNING:
            log.log(level, "stream %s: %s (%s)", self.id, state.value, reason)
        if changed and self._state_hook is not None:
            self._state_hook(self.id, state.value, reason)

    # -- the worker ------------------------------------------------------------------
    def _work(self) -> None:
        # This stream's own block state; kept, so a bench can switch its CPU clock.
        self.workflow_run = self.workflow.instantiate(self._cpu_clock)
        run: RunFn = self.workflow_run.run
        observe: ObserveFn = self.metrics.observe
        publish, trace = self._publish, self._trace
        if trace is not None:
            trace.bind()
        get, stop, clock = self.slot.get, self._stop, time.perf_counter
        demand = self._video
        # The frame in work, for the exemplars of the model runs it waits for.
        working, sid = self.metrics.tags.working, self.id
        while not stop.is_set():
            self._working_since = 0.0
            frame = get(GET_TIMEOUT_S)
            if frame is None:
                if self._state in TERMINAL:
                    break  # the source ended or failed, and its last frame was taken
                continue
            self._working_since = now = clock()
            working[sid] = frame.seq
            if self._switch is not None:  # at a frame boundary: this frame is the new one's
                run, observe, trace = self._apply_switch()
            shadow = self.shadow  # replaced whole by the runtime: one read per frame
            sampled = shadow is not None and shadow.offer(frame, now)
            try:
                result = run(frame, demand is None or demand.wanted(now))
            except Exception as exc:  # one bad frame must not end the stream
                self._frame_failed(exc)
                continue
            if sampled and shadow is not None:
                shadow.live(result)
            if stop.is_set():
                break  # stopped while busy (maybe replaced after a stall): a stale result
            self._account(result)
            observe(result)
            if trace is not None:
                trace(result)
            publish(result)
            if self._max_frames is not None and self.rate.count >= self._max_frames:
                self._grabber.stop(0)  # stop decoding; the worker ends here
                self._on_state(StreamState.STOPPED, f"processed {self._max_frames} frames")
                break
        self._working_since = 0.0
        self.done.set()

    @property
    def cpu_clock(self) -> CpuClock | None:
        """The clock its blocks' own CPU is read with (None: not read)."""
        return self._cpu_clock

    def switch(self, switch: Switch) -> None:
        """Run `switch.workflow` from the next frame the worker takes; `switch.done` is
        set once it does."""
        self._switch = switch

    def _apply_switch(self) -> tuple[RunFn, ObserveFn, StreamTrace | None]:
        """On the worker thread, between frames: the new workflow, its metrics and trace."""
        switch, self._switch = self._switch, None
        assert switch is not None
        self.workflow = switch.workflow
        self.workflow_run = switch.run or switch.workflow.instantiate(self._cpu_clock)
        self.metrics, self._trace = switch.metrics, switch.trace
        if switch.trace is not None:
            switch.trace.bind()
        switch.done.set()
        return self.workflow_run.run, self.metrics.observe, self._trace

    def _account(self, result: FrameResult) -> None:
        self.rate.tick(result.done_mono)
        self.latency.add(result.age_seconds)
        self.age_total += result.age_seconds  # s: a shadow's budget reads the mean age
        self.last_result_mono = result.done_mono
        for value in result.outputs.values():
            if isinstance(value, Detections):
                self.detections += len(value)

    def _frame_failed(self, exc: Exception) -> None:
        self.failed_frames += 1
        self.metrics.failed.inc()
        # An exception's text may carry a URL (a block that fetched something): masked.
        error = mask_url(f"workflow {self.workflow.name!r}: {type(exc).__name__}: {exc}")
        self._set_error(error)
        # The first failure with its traceback, then one line per 100 so logs stay readable.
        if self.failed_frames == 1:
            log.exception("stream %s: %s", self.id, error)
        elif self.failed_frames % 100 == 0:
            log.warning("stream %s: %d failed frames, last: %s", self.id, self.failed_frames, error)

    # -- supervision -----------------------------------------------------------------
    def heartbeat(self) -> Heartbeat:
        """Both threads' heartbeats as of now (read without a lock)."""
        worker = self._worker
        died = worker.ident is not None and not worker.is_alive() and not self.done.is_set()
        reading = self._grabber.stats.reading_since
        return Heartbeat(self._working_since, reading, worker.ident, died, self._started)

    def threads_alive(self) -> list[str]:
        """Names of the stream's threads still running: after `stop`, those it abandoned."""
        threads = [(self._worker.name, self._worker.is_alive())]
        threads.append((f"grab:{self.id}", self._grabber.alive))
        return [name for name, alive in threads if alive]

    def mark_stalled(self, reason: str) -> bool:
        """Report the stream `stalled` (the supervisor's call; the state stays while the
        stream is replaced); False when it already was."""
        with self._state_lock:
            if self._state == StreamState.STALLED:
                return False
            self._stall, self._stall_frames = reason, self.rate.count
        self._on_state(StreamState.STALLED, reason)
        return True

    @property
    def stall(self) -> str | None:
        """Why the stream stalled, until it processes a frame again; None if it did not."""
        if self._stall is None or self.rate.count > self._stall_frames:
            return None
        return self._stall

    def inherit(self, previous: Stream) -> None:
        """Carry on the history of the stream this one replaced after a stall: its
        transitions come first, and its stall stays reported until this one processes a
        frame (the proof that the restart helped)."""
        with self._state_lock:
            history = [*previous.transitions, *self.transitions]
            self.transitions.clear()
            self.transitions.extend(history)  # the deque keeps the newest `history` items
            self._stall, self._stall_frames = previous.stall, self.rate.count
        self.stall_streak = (previous.stall_streak if previous.rate.count == 0 else 0) + 1
        if self._error is None and previous._error is not None:
            # Its time stays; it clears once this one processes a frame.
            self._error = replace(previous._error, frames=self.rate.count)

    # -- views -----------------------------------------------------------------------
    def sync_metrics(self) -> None:
        """Copy counters owned by other threads into gauges (called by the stats loop)."""
        self.metrics.dropped.inc(self.slot.dropped - self._dropped_reported)
        self._dropped_reported = self.slot.dropped
        fps = self._grabber.stats.fps
        if fps is not None:
            self.metrics.source_fps.set(fps)

    def source_fps(self) -> float | None:
        """The rate the source delivers frames at now (None before it has a rate)."""
        return self._grabber.stats.fps

    def status(self, providers: dict[str, list[str]], sinks: dict[str, str]) -> StreamStatus:
        """The stream's figures for the API, `appliance run` and the stats log; the
        runtime knows the rest: `providers` maps its models to the providers they got,
        `sinks` every sink to its state."""
        grabber = self._grabber.stats
        latency = self.latency.percentiles_ms(50, 99)
        error = self._error
        return StreamStatus(
            id=self.id,
            state=state_name(self.state),
            url=self.url,
            workflow=self.workflow.name,
            fps=round(self.rate.overall(), 2),
            source_fps=_round(grabber.fps),
            frames_processed=self.rate.count,
            frames_dropped=self.slot.dropped,
            frames_failed=self.failed_frames,
            latency_ms=Latency(latency["p50"], latency["p99"]),
            detections=self.detections,
            reconnects=grabber.reconnects,
            last_error=None if error is None else error.reason,
            last_error_at=None if error is None else iso_utc(error.time),
            last_error_cleared=error is not None and self._error_cleared(error),
            providers=providers,
            outputs=[o.sink for o in self.cfg.outputs],
            sinks={o.sink: sinks.get(o.sink, "unknown") for o in self.cfg.outputs},
            transitions=[t.to_status() for t in list(self.transitions)],
            decoder=grabber.decoder,
            decoder_problem=grabber.decoder_problem,
        )


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 2)


def stop_all(streams: list[Stream], timeout: float) -> bool:
    """Stop streams in parallel (each joins two threads); True when every thread ended."""
    deadline = time.monotonic() + timeout
    results: dict[str, bool] = {}

    def stop(stream: Stream) -> None:
        results[stream.id] = stream.stop(timeout)

    stoppers = [
        threading.Thread(target=stop, args=(s,), name=f"stop:{s.id}", daemon=True) for s in streams
    ]
    for t in stoppers:
        t.start()
    for t in stoppers:
        t.join(max(0.0, deadline - time.monotonic()))
    ok = all(results.get(s.id, False) for s in streams)
    if streams:  # a runtime that only checked a config (validate) ran none: nothing to say
        log.info("streams stopped (%d)%s", len(streams), "" if ok else ", not every thread ended")
    return ok
