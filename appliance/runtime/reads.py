"""What a runtime says about itself: the reads that routes, probes, the CLI, commands and
the stats log make (`Runtime` is one of these, with the controls on top).

Each answer is a frozen snapshot (appliance/observe/status.py) built from the parts the runtime
owns; nothing here changes what runs.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Callable
from pathlib import Path

from prometheus_client import generate_latest

from appliance.errors import UnknownStreamError
from appliance.models.pool import ModelPool
from appliance.observe.blocklatency import BlockLatencies, StreamLatency
from appliance.observe.metrics import Metrics
from appliance.observe.status import (
    ModelStatus,
    ProfilingStatus,
    RuntimeStatus,
    SinkStatus,
    StreamStatus,
    WindowStatus,
)
from appliance.profiling.profiler import Profiler
from appliance.runtime.outputs import Outputs, Subscriber
from appliance.runtime.sharding import Shard
from appliance.runtime.streams import Stream
from appliance.runtime.supervisor import Supervisor
from appliance.watch.report import WatchReport
from appliance.watch.watch import Watch
from pipelines.geometry import Region


class RuntimeReads:
    """The read side of `Runtime`, over the parts it sets up in its `__init__`."""

    streams: dict[str, Stream]
    outputs: Outputs
    pool: ModelPool
    profiler: Profiler
    metrics: Metrics
    supervisor: Supervisor
    shard: Shard | None
    started_at: float
    _block_latency: BlockLatencies
    watch: Watch
    _stopping: threading.Event

    # -- running ---------------------------------------------------------------------
    def sync_metrics(self) -> None:
        for stream in list(self.streams.values()):
            stream.sync_metrics()
        self.outputs.sync_metrics()

    def unfinished(self) -> list[str]:
        """Ids of the streams whose worker still runs (a file not yet at its end)."""
        return [s.id for s in list(self.streams.values()) if not s.done.is_set()]

    def wait_done(self, timeout: float | None = None) -> bool:
        """Block until every stream's worker has ended; False on timeout."""
        deadline = None if timeout is None else time.monotonic() + timeout
        for stream in list(self.streams.values()):
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            if not stream.done.wait(left):
                return False
        return True

    # -- status: what routes, probes, the CLI and commands read -----------------------
    def status(self) -> RuntimeStatus:
        """Everything at once, as frozen snapshots (appliance/observe/status.py)."""
        sinks = self.outputs.statuses()
        return RuntimeStatus(
            started_at=self.started_at,
            problem=self.liveness_problem(),
            streams=self.streams_status(sinks),
            models=self.pool.describe(),
            sinks=sinks,
            profiling=self.profiling_status(),
            stalled=self.stalled(),
            shard=None if self.shard is None else str(self.shard),
        )

    def has_stream(self, stream_id: str) -> bool:
        return stream_id in self.streams

    def subscribe(self, fn: Subscriber, stream_id: str | None = None) -> Callable[[], None]:
        """Call `fn(result)` on the worker thread with every result (of `stream_id` only,
        if given), as the sinks get them; it must be quick. Returns the unsubscribe."""
        return self.outputs.subscribe(fn, stream_id)

    def streams_status(self, sinks: list[SinkStatus] | None = None) -> list[StreamStatus]:
        """Every stream's status; `sinks`: the sinks' statuses when already read."""
        states = _states(self.outputs.statuses() if sinks is None else sinks)
        return [self._stream_status(s, states) for s in list(self.streams.values())]

    def stream_status(self, stream_id: str) -> StreamStatus:
        """One stream's status; UnknownStreamError if no stream has that id."""
        stream = self.streams.get(stream_id)
        if stream is None:
            raise UnknownStreamError(stream_id)
        return self._stream_status(stream, _states(self.outputs.statuses()))

    def stream_regions(self, stream_id: str) -> list[Region]:
        """The lines and zones one stream's workflow counts against (for viewers to draw);
        UnknownStreamError for an unknown id."""
        stream = self.streams.get(stream_id)
        if stream is None:
            raise UnknownStreamError(stream_id)
        return list(stream.workflow.regions)

    def stream_latency(self, stream_id: str) -> StreamLatency:
        """One stream's recent per-block latency; UnknownStreamError for an unknown id."""
        return self._block_latency.report(stream_id)

    def _stream_status(self, stream: Stream, sinks: dict[str, str]) -> StreamStatus:
        models = self.pool.handles
        providers = {m: list(models[m].info.providers)
                     for m in stream.workflow.models if m in models}  # fmt: skip
        status = stream.status(providers, sinks)
        return dataclasses.replace(status, watch=self.watch.stream_status(stream.id))

    def regressions(self) -> WatchReport:
        """The regression watch: the host, active regressions and their history."""
        return self.watch.report()

    def rebaseline(self, stream_id: str) -> list[str]:
        """Learn the stream's baselines again from now (after an intended change): the
        rows that start over. The watch's only change; UnknownStreamError for an unknown
        id. What runs is not touched."""
        if stream_id not in self.streams:
            raise UnknownStreamError(stream_id)
        try:
            return self.watch.rebaseline(stream_id)
        except KeyError:  # removed meanwhile
            raise UnknownStreamError(stream_id) from None

    def models_status(self) -> list[ModelStatus]:
        return self.pool.describe()

    def sinks_status(self) -> list[SinkStatus]:
        return self.outputs.statuses()

    def profiling_status(self) -> ProfilingStatus:
        return self.profiler.status()

    def metrics_text(self) -> bytes:
        """The Prometheus exposition, counters owned by other threads synced first."""
        self.sync_metrics()
        return bytes(generate_latest(self.metrics.registry))

    # -- profiling windows -------------------------------------------------------------
    def start_profiling(
        self, duration_s: float, streams: list[str] | None = None, ort_operators: bool = False
    ) -> WindowStatus:
        """Start a profiling window now (it runs on its own thread); WindowBusyError if
        one runs, WindowRequestError for a bad duration or an unknown stream."""
        return self.profiler.windows.start(duration_s, streams, ort_operators)

    def profiling_window(self, window_id: str) -> WindowStatus:
        return self.profiler.windows.get(window_id)

    def profiling_trace(self, window_id: str) -> Path:
        """The finished window's trace file; WindowNotReadyError while it runs."""
        return self.profiler.windows.trace_path(window_id)

    # -- liveness -------------------------------------------------------------------
    def liveness_problem(self) -> str | None:
        """None while the runtime can work; else why not (GET /health answers 503)."""
        if self._stopping.is_set():
            return "runtime stopped"
        problem = self.supervisor.problem
        return None if problem is None else f"stream supervisor {problem}"

    def stalled(self) -> dict[str, str]:
        """Stream id -> why it stalled, while its restarted stream has processed nothing."""
        return {s.id: reason for s in list(self.streams.values()) if (reason := s.stall)}


def _states(sinks: list[SinkStatus]) -> dict[str, str]:
    return {s.name: s.state for s in sinks}
