"""A runtime's stop, in its order and once each part: supervision, profiling windows,
the watch and every stream first (in parallel: what runs on its own), then the sinks
drain what they hold, then the models and the profiler. `Runtime.stop_streams`,
`stop_outputs` and `stop` are these; `serve` calls the first two itself, between
closing the listener and letting requests drain (appliance/server/serve.py)."""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field

from appliance.models.pool import ModelPool
from appliance.observe.latest import LatestResults
from appliance.profiling.profiler import Profiler
from appliance.runtime.outputs import Outputs
from appliance.runtime.running import RunningStreams
from appliance.runtime.streams import stop_all
from appliance.runtime.supervisor import Supervisor
from appliance.watch.watch import Watch

log = logging.getLogger("appliance.runtime")

SINK_DRAIN_S = 2.0  # at shutdown, after the streams: what the sinks still hold goes out


@dataclass
class Shutdown:
    """The parts a runtime stops, and what each stop answered (a second call answers the
    first's outcome)."""

    supervisor: Supervisor
    profiler: Profiler
    watch: Watch
    streams: RunningStreams
    latest: LatestResults
    outputs: Outputs
    pool: ModelPool
    stopping: threading.Event = field(default_factory=threading.Event)  # no restarts now
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _streams_ok: bool | None = None
    _outputs_ok: bool | None = None

    def stop_streams(self, timeout: float) -> bool:
        """Supervision, profiling windows, the watch and every stream (in parallel); models
        go on serving requests. Once: a later call waits for the first and returns its
        result (True when every thread ended)."""
        self.stopping.set()
        self.latest.close()  # readers of results (events, MJPEG) end now
        with self._lock:
            if self._streams_ok is None:
                deadline = time.monotonic() + timeout
                self.supervisor.stop(timeout / 2)  # a restart in progress ends before we look
                self.profiler.windows.stop()
                self.watch.stop(timeout / 4)
                left = max(0.1, deadline - time.monotonic())
                self._streams_ok = stop_all(self.streams.running(), left)
            return self._streams_ok

    def stop_outputs(self, timeout: float = SINK_DRAIN_S) -> bool:
        """After the streams: the sinks get up to `timeout` to send what they hold, then
        stop. Once: a later call answers the first's outcome."""
        if self._outputs_ok is None:
            self._outputs_ok = self.outputs.stop(timeout)
        return self._outputs_ok

    def stop(self, timeout: float, announce: bool) -> bool:
        """Streams, sinks, then models and the profiler; True when every thread ended.
        `announce`: say so at INFO (a runtime that only checked a config says nothing)."""
        deadline = time.monotonic() + timeout
        streams_ok = self.stop_streams(timeout * 0.6)
        sinks_ok = self.stop_outputs(min(SINK_DRAIN_S, max(0.1, deadline - time.monotonic())))
        models_ok = self.pool.stop(max(0.1, deadline - time.monotonic()))
        models_ok = self.profiler.stop(max(0.1, deadline - time.monotonic())) and models_ok
        ok = models_ok and streams_ok and sinks_ok
        level = logging.INFO if announce or not ok else logging.DEBUG
        log.log(level, "runtime stopped%s", "" if ok else " (some threads did not end in time)")
        return ok
