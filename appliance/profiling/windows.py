"""On-demand profiling windows: everything the tracer records for `duration_s`, plus, with
`ort_operators`, ONNX Runtime's per-operator timings on the same timeline.

ORT can only profile a session created with profiling on, and ends a session's profile
once; this ORT's RunOptions has no per-run profiling. So for the window each model's
batcher runs every Nth batch (`profiling.ort_sample_every_n_batches`) on a second,
profiled session of the same model on the same providers (as `appliance model bench
--profile` does), at most `ort_max_runs_per_window` per model (appliance/profiling/
sampling.py), and stops at the end, when that session's profile is read. ORT's profiler
makes every run it records about 1.5 times as long (docs/profiling.md), so sampling is
what keeps a window's cost bounded. Operator events are put on the model's batcher track,
inside the `session.run` span that ran them (appliance/profiling/operators.py), each with
its stage (host->device copy, compute, device->host copy); every profiled run's stages are
observed into `appliance_model_stage_seconds` when the window ends. One window at a time.
"""

from __future__ import annotations

import logging
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from prometheus_client import Gauge, Histogram

from appliance.errors import (
    UnknownWindowError,
    WindowBusyError,
    WindowNotReadyError,
    WindowRequestError,
)
from appliance.models.batcher import ModelBatcher
from appliance.models.pool import ModelPool
from appliance.observe.status import WindowState, WindowStatus
from appliance.profiling.hooks import STREAM_COUNTERS
from appliance.profiling.operators import RunStages, place, with_stages
from appliance.profiling.ort_profile import profiling_session, read_operators
from appliance.profiling.rolling import RollingWriter, TraceFile
from appliance.profiling.sampling import SampledSessions
from appliance.profiling.tracer import Tracer

log = logging.getLogger("appliance.profiling")


@dataclass
class Window:
    id: str
    duration_s: float
    streams: list[str] | None
    ort_operators: bool
    state: WindowState = "running"
    error: str | None = None
    path: Path | None = None
    events: list[dict[str, Any]] = field(default_factory=list)
    span_us: tuple[int, int] = (0, 0)  # wall-clock µs it ran over, as the trace's `ts`

    def status(self) -> WindowStatus:
        return WindowStatus(
            self.id,
            self.state,
            f"/v1/profiling/{self.id}/trace",
            self.duration_s,
            None if self.streams is None else list(self.streams),
            self.ort_operators,
            self.error,
        )


# A batcher switched to its model's profiled twin for a window: the sampling, and the folder
# ORT writes the twin's profile into.
_Swapped = tuple[ModelBatcher, SampledSessions, Path]
KEEP_WINDOWS = 20  # windows (and their trace files) kept; each one is at most a few MB


class ProfilingWindows:
    def __init__(
        self,
        tracer: Tracer,
        writer: RollingWriter,
        pool: ModelPool,
        stream_ids: Callable[[], Iterable[str]],
        directory: Path,
        max_window_s: float,
        active: Gauge,
        ort_every_n: int = 1,
        ort_max_runs: int = 100,
        stages: Histogram | None = None,
    ) -> None:
        self._tracer, self._writer, self._pool = tracer, writer, pool
        self._stream_ids = stream_ids
        self.directory = directory
        self._max_s = max_window_s
        self._ort_every_n = ort_every_n  # profile one batch in N: ORT's profiler is costly
        self._ort_max_runs = ort_max_runs  # per model and window: ORT keeps them in memory
        self._active = active
        self._stages = stages  # appliance_model_stage_seconds: per profiled run, by stage
        self._windows: dict[str, Window] = {}
        self._running: Window | None = None
        self._lock = threading.Lock()
        self._stop = threading.Event()

    def start(
        self, duration_s: float, streams: list[str] | None, ort_operators: bool
    ) -> WindowStatus:
        """Start a window now; it runs on its own thread. WindowBusyError if one runs."""
        if not 0 < duration_s <= self._max_s:
            raise WindowRequestError(
                f"duration_s: must be > 0 and <= {self._max_s:g} (profiling.max_window_s), "
                f"got {duration_s:g}"
            )
        unknown = sorted(set(streams or ()) - set(self._stream_ids()))
        if unknown:
            raise WindowRequestError(f"streams: unknown stream(s) {unknown}")
        if not self._tracer.enabled:
            raise WindowRequestError("profiling is disabled (profiling.enabled: false)")
        with self._lock:
            if self._running is not None:
                raise WindowBusyError(self._running.id)
            window = Window(uuid.uuid4().hex[:12], duration_s, streams, ort_operators)
            self._running = self._windows[window.id] = window
            expired = self._expire()
        for path in expired:
            path.unlink(missing_ok=True)
        threading.Thread(
            target=self._run, args=(window,), name=f"profile:{window.id}", daemon=True
        ).start()
        return window.status()

    def _expire(self) -> list[Path]:
        """Forget the oldest windows past KEEP_WINDOWS; their trace files to delete.
        Under the lock (the running window is the newest, never among them)."""
        paths = []
        while len(self._windows) > KEEP_WINDOWS:
            oldest = self._windows.pop(next(iter(self._windows)))
            if oldest.path is not None:
                paths.append(oldest.path)
        return paths

    @property
    def active(self) -> bool:
        return self._running is not None

    def running_id(self) -> str | None:
        """The window running now (an exemplar's `window`), None when none does."""
        running = self._running
        return None if running is None else running.id

    def covering(self, t0_us: int, t1_us: int) -> tuple[str, Path] | None:
        """The newest done window whose trace spans [t0_us, t1_us] (wall-clock µs), as
        (id, path); None when none does (appliance/profiling/frametrace.py)."""
        for window in reversed(list(self._windows.values())):
            lo, hi = window.span_us
            if window.state == "done" and window.path is not None and lo <= t0_us <= t1_us <= hi:
                return window.id, window.path
        return None

    def get(self, window_id: str) -> WindowStatus:
        return self._window(window_id).status()

    def trace_path(self, window_id: str) -> Path:
        window = self._window(window_id)
        if window.state != "done" or window.path is None:
            reason = window.error or "still running"
            raise WindowNotReadyError(f"window {window_id} has no trace: {reason}")
        return window.path

    def stop(self) -> None:
        """End a running window early (shutdown): it writes what it has."""
        self._stop.set()

    def _window(self, window_id: str) -> Window:
        window = self._windows.get(window_id)
        if window is None:
            raise UnknownWindowError(window_id)
        return window

    # -- the window's thread ---------------------------------------------------------
    def _run(self, window: Window) -> None:
        self._active.set(1)
        swapped: list[_Swapped] = []
        listener = window.events.extend
        try:
            if window.ort_operators:
                swapped = self._profile_models()
            self._writer.listeners.append(listener)
            t0 = time.perf_counter()
            self._stop.wait(window.duration_s)
            t1 = time.perf_counter()
            anchor = self._tracer.anchor_us
            window.span_us = (int(t0 * 1e6 + anchor), int(t1 * 1e6 + anchor))
            self._writer.flush()  # hands this window's last events to the listener
            ops = self._restore(swapped)
            swapped = []
            window.path = self._write(window, t0, t1, ops)
            window.state = "done"
        except Exception as exc:  # a failed window is reported, never raised
            window.state, window.error = "failed", f"{type(exc).__name__}: {exc}"
            log.exception("profiling window %s failed", window.id)
        finally:
            if listener in self._writer.listeners:
                self._writer.listeners.remove(listener)
            self._restore(swapped)
            window.events = []
            with self._lock:
                self._running = None
            self._active.set(0)

    def _profile_models(self) -> list[_Swapped]:
        swapped = []
        for model_id, batcher in list(self._pool.handles.items()):
            tmp = Path(tempfile.mkdtemp(prefix="ort-window-"))
            # Its idle threads must sleep at once: spinning, they would take the cores
            # from the main session's runs in between (measured: a window at 0.67 of off).
            spec = self._pool.session_spec(model_id)
            session = profiling_session(batcher.model, spec, tmp, spin=False)
            sampled = SampledSessions(session, self._ort_every_n, self._ort_max_runs)
            batcher.choose_sessions(sampled)
            swapped.append((batcher, sampled, tmp))
        return swapped

    def _restore(self, swapped: list[_Swapped]) -> list[dict[str, Any]]:
        """Switch the batchers back; ORT's operator events of the profiled sessions."""
        ops: list[dict[str, Any]] = []
        for batcher, sampled, tmp in swapped:
            batcher.choose_sessions(None)  # returns once no batch runs on the profiled one
            model = batcher.info.id
            for event in read_operators(sampled.session):
                event["model"] = model
                ops.append(event)
            tmp.rmdir()
        return ops

    def _write(self, window: Window, t0: float, t1: float, ops: list[dict[str, Any]]) -> Path:
        lo, hi = (int(t * 1e6 + self._tracer.anchor_us) for t in (t0, t1))
        meta = {(e["name"], e["tid"]): e for e in window.events if e["ph"] == "M"}  # one each
        keep = [
            *meta.values(),
            *(e for e in window.events if e["ph"] != "M" and lo <= e["ts"] <= hi),
        ]
        if window.streams:
            keep = [e for e in keep if _for_streams(e, set(window.streams))]
        placed = place(ops, keep, self._tracer.pid)
        if self._stages is not None:
            observe_stages(self._stages, placed.runs)
        keep = with_stages(keep, placed.runs, self._tracer.pid)
        keep.extend(placed.operators)
        other = {
            "source": "appliance profiling window",
            "window": window.id,
            "duration_s": window.duration_s,
            "ort_operators": window.ort_operators,
            "operators": placed.placement,
        }
        path = self.directory / "windows" / f"window-{window.id}.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        trace = TraceFile(path, compress=False, other=other)  # in chunks: GIL held briefly
        try:
            trace.write(keep)
            return trace.close()
        except BaseException:
            trace.discard()
            raise


def observe_stages(histogram: Histogram, runs: list[RunStages]) -> None:
    """Every profiled run's stages into `histogram` (labels model, stage; seconds), runs
    of streams left out of the trace too: a model's time is the model's. A stage is
    observed for a model only if some run of it had that stage in the window, so a model
    on the CPU provider has compute alone, and a device model's run without a copy counts
    0 for it."""
    had = {(r.model, stage) for r in runs for stage, us in r.us.items() if us}
    for r in runs:
        for stage, us in r.us.items():
            if (r.model, stage) in had:
                histogram.labels(r.model, stage).observe(us / 1e6)  # µs -> s


def _for_streams(event: dict[str, Any], streams: set[str]) -> bool:
    if event["ph"] == "C":  # a stream's own counter goes with it; a model's is shared
        prefix, _, owner = str(event["name"]).partition(":")
        return prefix not in STREAM_COUNTERS or owner in streams
    if event["ph"] == "M":
        return True
    args = event.get("args") or {}
    if "stream" in args:
        return args["stream"] in streams
    return bool(streams.intersection(args.get("streams", ())))
