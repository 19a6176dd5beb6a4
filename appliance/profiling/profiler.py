"""The runtime's profiling, in one object: the tracer every stream and batcher writes
to, the rolling trace writer, and the on-demand windows (appliance/profiling/windows.py).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from pathlib import Path

from appliance.errors import WindowRequestError
from appliance.models.batcher import BatchRecord
from appliance.models.pool import ModelPool
from appliance.observe.metrics import Metrics
from appliance.observe.status import ProfilingStatus
from appliance.profiling.config import ProfilingConfig
from appliance.profiling.frametrace import FrameTrace, FrameTraces, RecentEvents
from appliance.profiling.hooks import trace_batch
from appliance.profiling.rolling import FLUSH_S, RollingWriter
from appliance.profiling.tracer import Tracer
from appliance.profiling.windows import ProfilingWindows


class Profiler:
    """`start` once (after the streams), `stop` once; `open_windows` before either."""

    def __init__(self, config: ProfilingConfig, directory: Path, metrics: Metrics) -> None:
        self.config = config
        self.directory = directory  # traces: rolling/ and windows/ go inside
        self.tracer = Tracer(enabled=config.enabled)
        self.writer = RollingWriter(
            self.tracer,
            directory,
            rotate_s=config.rotate_s,
            keep_files=config.keep_files,
            keep_bytes=config.keep_bytes,
            compress=config.gzip,
            written=metrics.trace_files,
            errors=metrics.trace_errors,
        )
        self._metrics = metrics
        self._windows: ProfilingWindows | None = None
        # A frame's trace (GET /v1/streams/{id}/frames/{seq}/trace): the writer's last
        # flushes in memory, then its files; the exemplars name the file and window.
        self.recent = RecentEvents(keep_s=config.rotate_s + 2 * FLUSH_S)
        self.writer.listeners.append(self.recent)
        self.frames = FrameTraces(self.writer, self.recent, self._covering)
        if self.tracer.enabled:
            metrics.tags.trace_file = self.writer.current_name
            metrics.tags.window = self._running_window

    def _covering(self, t0_us: int, t1_us: int) -> tuple[str, Path] | None:
        windows = self._windows
        return None if windows is None else windows.covering(t0_us, t1_us)

    def _running_window(self) -> str | None:
        windows = self._windows
        return None if windows is None else windows.running_id()

    def frame_trace(self, stream: str, seq: int, around: int) -> FrameTrace:
        """Frame `seq` of `stream` and its neighbours; FrameNotHeldError when no trace
        held has it (WindowRequestError when tracing is off)."""
        if not self.tracer.enabled:
            raise WindowRequestError("profiling is disabled (profiling.enabled: false)")
        return self.frames.trace(stream, seq, around)

    def on_batch(self, record: BatchRecord) -> None:
        """The model pool's per-batch hook: the batch's spans on the batcher's track."""
        trace_batch(self.tracer, record)

    def open_windows(self, pool: ModelPool, stream_ids: Callable[[], Iterable[str]]) -> None:
        """Make on-demand windows possible over the pool's models and these streams (the
        pool needs `on_batch` first, so this is a second step)."""
        self._windows = ProfilingWindows(
            self.tracer,
            self.writer,
            pool,
            stream_ids,
            self.directory,
            self.config.max_window_s,
            self._metrics.window_active,
            self.config.ort_sample_every_n_batches,
            self.config.ort_max_runs_per_window,
            stages=self._metrics.model_stage,
        )

    @property
    def windows(self) -> ProfilingWindows:
        if self._windows is None:
            raise RuntimeError("Profiler.open_windows was not called")
        return self._windows

    def status(self) -> ProfilingStatus:
        return ProfilingStatus(
            enabled=self.tracer.enabled,
            trace_dir=str(self.writer.directory),
            window_active=self._windows is not None and self._windows.active,
            last_write_error=self.writer.last_error,
        )

    def start(self) -> None:
        if self.tracer.enabled:
            self.writer.start()

    def stop(self, timeout: float) -> bool:
        """End a running window early (it writes what it has) and the rolling writer."""
        if self._windows is not None:
            self._windows.stop()
        return self.writer.stop(timeout)
