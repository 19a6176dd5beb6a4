"""What a runtime says about itself at once: the snapshots that routes, probes, the CLI,
commands and the stats log read through `Runtime` (appliance/runtime/runtime.py), which
holds one `RuntimeReads` over the parts it owns and hands them in here.

Each answer is a frozen snapshot (appliance/observe/status.py) built from those parts,
read live (the streams are the runtime's own table, appliance/runtime/running.py);
nothing here changes what runs.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable, Collection

from prometheus_client import generate_latest

from appliance.models.pool import ModelPool
from appliance.observe.metrics import Metrics
from appliance.observe.openmetrics import render as openmetrics_render
from appliance.observe.status import (
    Origin,
    RuntimeStatus,
    SinkStatus,
    StateStatus,
    StreamStatus,
)
from appliance.profiling.profiler import Profiler
from appliance.runtime.outputs import Outputs
from appliance.runtime.running import RunningStreams
from appliance.runtime.sharding import Shard
from appliance.runtime.streams import Stream
from appliance.runtime.supervisor import Supervisor
from appliance.watch.watch import Watch


class RuntimeReads:
    """The read side of a runtime, over the parts it owns. Thread-safe as the parts are:
    any thread may read while the runtime changes its streams."""

    def __init__(
        self,
        streams: RunningStreams,
        *,
        outputs: Outputs,
        pool: ModelPool,
        profiler: Profiler,
        watch: Watch,
        metrics: Metrics,
        supervisor: Supervisor,
        stopping: threading.Event,
        shard: Shard | None,
        requested: Collection[str] = (),
        state: Callable[[], StateStatus | None] = lambda: None,
    ) -> None:
        self._streams = streams  # the runtime's table: it starts and stops, we read
        self._outputs = outputs
        self._pool = pool
        self._profiler = profiler
        self._watch = watch
        self._metrics = metrics
        self._supervisor = supervisor
        self._stopping = stopping  # set when the runtime's stop begins
        self._shard = shard
        self._requested = requested  # the runtime's ids of streams added over the API
        self._state = state

    # -- everything at once ------------------------------------------------------------
    def status(self, started_at: float) -> RuntimeStatus:
        """Everything at once, as frozen snapshots (appliance/observe/status.py)."""
        sinks = self._outputs.statuses()
        return RuntimeStatus(
            started_at=started_at,
            problem=self.liveness_problem(),
            streams=self.streams_status(sinks),
            models=self._pool.describe(),
            sinks=sinks,
            profiling=self._profiler.status(),
            stalled=self._streams.stalled(),
            shard=None if self._shard is None else str(self._shard),
            state=self._state(),
        )

    # -- streams -----------------------------------------------------------------------
    def streams_status(self, sinks: list[SinkStatus] | None = None) -> list[StreamStatus]:
        """Every stream's status; `sinks`: the sinks' statuses when already read."""
        states = _states(self._outputs.statuses() if sinks is None else sinks)
        return [self._stream_status(s, states) for s in self._streams.running()]

    def stream_status(self, stream_id: str) -> StreamStatus:
        """One stream's status; UnknownStreamError if no stream has that id."""
        stream = self._streams.find(stream_id)
        return self._stream_status(stream, _states(self._outputs.statuses()))

    def _stream_status(self, stream: Stream, sinks: dict[str, str]) -> StreamStatus:
        models = self._pool.handles
        providers = {
            m: list(models[m].info.providers) for m in stream.workflow.models if m in models
        }
        status = stream.status(providers, sinks)
        origin: Origin = "api" if stream.id in self._requested else "config"
        return dataclasses.replace(
            status, watch=self._watch.stream_status(stream.id), origin=origin
        )

    # -- liveness and metrics ----------------------------------------------------------
    def liveness_problem(self) -> str | None:
        """None while the runtime can work; else why not (GET /health answers 503)."""
        if self._stopping.is_set():
            return "runtime stopped"
        problem = self._supervisor.problem
        return None if problem is None else f"stream supervisor {problem}"

    def sync_metrics(self) -> None:
        """Bring the counters other threads own (streams', sinks') into the registry."""
        for stream in self._streams.running():
            stream.sync_metrics()
        self._outputs.sync_metrics()

    def metrics_text(self, openmetrics: bool = False) -> bytes:
        """The Prometheus exposition, counters owned by other threads synced first: the
        classic text format, or OpenMetrics (the only one that carries exemplars)."""
        self.sync_metrics()
        render = openmetrics_render if openmetrics else generate_latest
        return bytes(render(self._metrics.registry))


def _states(sinks: list[SinkStatus]) -> dict[str, str]:
    return {s.name: s.state for s in sinks}
