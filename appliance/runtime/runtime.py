"""The runtime owns everything that runs: models and their batchers, compiled
workflows, streams, the fan-out and the metrics. `start()` then `stop()`, once each.

Start-up order is fail-fast: models load and every workflow compiles before any stream
starts, so a bad model or workflow stops the start with every problem named, and nothing
half-runs.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path

from appliance.config import AppConfig, ConfigError, StreamConfig, TuningConfig, sink_configs
from appliance.errors import StateSaveError, UnknownStreamError
from appliance.models import ModelBatcher
from appliance.models.batcher import BatchRecord
from appliance.models.pool import ModelPool
from appliance.observe.audit import AuditLog
from appliance.observe.blocklatency import BlockLatencies, StreamLatency
from appliance.observe.latest import LatestResults
from appliance.observe.metrics import LATENCY_BUCKETS, Metrics
from appliance.observe.slowest import SlowFrame
from appliance.observe.status import (
    ModelStatus,
    ProfilingStatus,
    RuntimeStatus,
    SinkStatus,
    StreamStatus,
    WindowStatus,
)
from appliance.policy.files import FilePolicy
from appliance.policy.hosts import SourceHosts
from appliance.policy.request_files import request_policy
from appliance.profiling.frametrace import AROUND, FrameTrace
from appliance.profiling.profiler import Profiler
from appliance.runtime.checking import Problems
from appliance.runtime.commands import runtime_commands
from appliance.runtime.control import one_change_at_a_time
from appliance.runtime.outputs import Outputs, Subscriber
from appliance.runtime.reads import RuntimeReads
from appliance.runtime.reload import ReloadPlan
from appliance.runtime.reloading import apply_reload
from appliance.runtime.retuning import Retuned, apply_tuning
from appliance.runtime.running import RunningStreams
from appliance.runtime.shadowing import build_shadows
from appliance.runtime.sharding import Shard
from appliance.runtime.shutdown import SINK_DRAIN_S, Shutdown
from appliance.runtime.sinkstate import sink_documents
from appliance.runtime.state import StreamsState
from appliance.runtime.streams import Stream
from appliance.runtime.supervisor import Supervisor, restart_stalled
from appliance.runtime.tuningstate import TuningState
from appliance.runtime.workflows import WorkflowCache, WorkflowRef
from appliance.watch.report import WatchReport
from appliance.watch.setup import build_watch
from pipelines.executor import CompiledWorkflow
from pipelines.geometry import Region
from pipelines.registry import DEFAULT_REGISTRY
from sinks.mqtt.commands import CommandHandler

log = logging.getLogger("appliance.runtime")


class Runtime:
    """Models, workflows, streams, outputs and profiling: started, changed and stopped
    here, and read through the parts that own them (its reads: RuntimeReads)."""

    def __init__(
        self,
        config: AppConfig,
        *,
        max_frames: int | None = None,
        config_path: Path | None = None,
        shard: Shard | None = None,
        worker: int | None = None,
        on_command: CommandHandler | None = None,
        take_commands: bool = True,
    ) -> None:
        self.shard = shard  # runs only its share of the config's streams (and on reload)
        self.config = config if shard is None else shard.apply(config)
        self.config_path = config_path  # re-read by reload()
        prof = config.profiling
        # A worker of `serve --workers` (appliance/workers/) writes its own files, and its
        # MQTT sessions take their own client ids (the broker drops a duplicate's).
        trace_dir = config.resolve(prof.dir)
        trace_dir = trace_dir if worker is None else trace_dir / f"worker-{worker}"
        self.metrics = Metrics(prof.buckets or LATENCY_BUCKETS, exemplars=prof.exemplars)
        self.profiler = Profiler(prof, trace_dir, self.metrics)
        # Read once at start, like `server`: a reload changes streams and models.
        self.limits = config.limits
        self.hosts = SourceHosts.of(config.server.allowed_source_hosts)  # sources may reach
        self.files = FilePolicy.owner(config)  # the config's own paths: the owner's
        self.request_files = request_policy(config, config_path)  # the API's: roots
        # What the API changed, kept across restarts (server.state_dir; runtime/state.py).
        self.state = StreamsState.of(config, None if worker is None else shard, self.files)
        self.tuned = TuningState.of(config, worker, self.files)  # a tune's, runtime/tuningstate.py
        # Sinks and in-process subscribers; dead letters go beside the traces.
        self.outputs = Outputs(
            sink_configs(config),
            self.metrics,
            trace_dir,
            on_command or runtime_commands(self),  # MQTT commands: run here by default
            self.files,
            client_suffix="" if worker is None else f"-w{worker}",
            take_commands=take_commands,
            documents=sink_documents(config, worker, self.files),  # runtime/sinkstate.py
            tracer=self.profiler.tracer,
        )
        self.audit = AuditLog(self.outputs.publish_event)  # changes: who, what, how it ended
        self.latest = LatestResults()  # every stream's newest result, for the API to read
        self.outputs.subscribe(self.latest)
        self._block_latency = BlockLatencies()  # each stream's recent per-block latency
        self.outputs.subscribe(self._block_latency)
        # The regression watch: each result and batch against its baseline (appliance/watch).
        self.watch = build_watch(
            prof.watch,
            trace_dir,
            self.files,
            self.metrics,
            self.profiler,
            self.outputs.publish_event,
            self.state.baselines(),
        )
        self.outputs.subscribe(self.watch)
        self.pool = ModelPool(
            self.metrics,
            on_batch=self._on_batch,  # the batch's spans, and the watch's samples
            max_models=self.limits.max_models,
            idle_models=self.limits.idle_models,
        )
        self.pool.retune(self.config.tuning.models)  # `tuning:` over every model it loads
        self.workflows = WorkflowCache(self.pool, max_blocks=self.limits.max_blocks)
        self.pool.on_release = self.workflows.forget_model
        self.profiler.open_windows(self.pool, lambda: list(self.streams))
        # The running streams by id, and what each is wired to (appliance/runtime/running.py).
        self.streams: RunningStreams = RunningStreams(
            lambda: self.config,  # as it is when a stream starts: reloads replace it
            outputs=self.outputs,
            metrics=self.metrics,
            tracer=self.profiler.tracer,
            hosts=self.hosts,
            block_latency=self._block_latency,
            watch=self.watch,
            release=self.release_workflow,
            max_streams=self.limits.max_streams,
            max_frames=max_frames,
        )
        self.video = self.streams.video  # who reads each stream's video: a hold draws it
        self._requested: set[str] = set()  # ids of streams added over the API
        self._control = threading.RLock()  # one change at a time (appliance/runtime/control.py)
        # Candidate workflows beside the live ones (appliance/runtime/shadowing.py).
        self.shadows = build_shadows(self, self._control, self._requested)
        self.started_at = 0.0
        # Finds stalled streams and restarts them (the supervision section below).
        self.supervisor = Supervisor(
            self.streams.running, self._on_stalled, config.limits.worker_stall_s
        )
        self._shutdown = Shutdown(
            self.supervisor,
            self.profiler,
            self.watch,
            self.streams,
            self.latest,
            self.outputs,
            self.pool,
        )
        self._stopping = self._shutdown.stopping  # stop began: no restarts, /health says so
        self._reads = RuntimeReads(
            self.streams,
            outputs=self.outputs,
            pool=self.pool,
            profiler=self.profiler,
            watch=self.watch,
            metrics=self.metrics,
            supervisor=self.supervisor,
            stopping=self._stopping,
            shard=self.shard,
            requested=self._requested,
            state=lambda: self.tuned.status(self.state.status()),
        )

    # -- start-up --------------------------------------------------------------------
    def prepare(
        self, problems: Problems | None = None, skip: frozenset[str] = frozenset()
    ) -> list[tuple[StreamConfig, CompiledWorkflow]]:
        """Load every model and compile every stream's workflow; start nothing yet.

        Every model is loaded and every workflow compiled even after one fails: one
        failure is raised as itself (ModelLoadError, WorkflowError, ...), several as a
        ConfigError listing them all, with those `problems` held already (the config's).
        Models already loaded are stopped again, so a failed prepare leaves no thread
        behind. `skip`: ids of the config's streams not to prepare (the state's).
        """
        for name, problem in DEFAULT_REGISTRY.load_plugins().items():
            log.error("block plugin %r left out: %s", name, problem)
        if problems is None:
            problems = Problems(str(self.config_path or "config"))
        prepared: list[tuple[StreamConfig, CompiledWorkflow]] = []
        try:
            failed = self.load_models(problems)
            for i, s in enumerate(self.config.streams):
                if s.id in skip:
                    continue
                with problems.check():
                    workflow = self.compile_stream_workflow(s, f"streams[{i}]", unavailable=failed)
                    prepared.append((s, workflow))
                with problems.check():  # its shadow's candidate too, named with the stream
                    self.shadows.check(s, self.files)
            problems.raise_any()
            return prepared
        except BaseException:
            for _, workflow in prepared:
                self.release_workflow(workflow)
            self.pool.stop(1.0)
            raise

    def start(self) -> None:
        """Prepare, then start every stream (and the rolling trace writer): the config's,
        less those the state holds, then the state's (appliance/runtime/state.py)."""
        self.started_at = time.time()
        restore = self.state.open([s.id for s in self.config.streams])
        # At start, not in __init__: a check (appliance validate) must not drop a document.
        self.config = self.tuned.open(self.config)  # a tune's kept tuning over the file's
        self.pool.retune(self.config.tuning.models)  # no model loaded yet: only remembered
        prepared = self.prepare(skip=restore.skip)
        self.outputs.start()  # before the streams: their first results have somewhere to go
        for cfg, workflow in prepared:
            self.shadows.declared(self.streams.start(cfg, workflow), self.files)
        restore.start_each(lambda cfg: self._start_stream(cfg, True), str(self.state.path))
        self.profiler.start()
        self.watch.changed("start", "the appliance started")
        self.watch.start()
        self.supervisor.start()

    def load_models(self, problems: Problems, pin: bool = True) -> frozenset[str]:
        """Load the config's models (workflows may add their own when compiled); each
        failure goes to `problems`. Returns the ids of those that did not load. `pin`
        False: each is leased once instead (a check: `pool.release` them after)."""
        files = self.files.at(self.config.base_dir)
        failed: list[str] = []
        for model_id, spec in self.config.models.items():
            with problems.check():
                self.pool.ensure(model_id, spec, files, f"models.{model_id}", pin=pin)
                continue
            failed.append(model_id)  # only after a failure: `continue` skips it
        return frozenset(failed)

    def compile_workflow(
        self,
        workflow: WorkflowRef,
        where: str,
        files: FilePolicy | None = None,
        unavailable: frozenset[str] = frozenset(),
    ) -> CompiledWorkflow:
        """Compile (or reuse) a workflow and lease its models to the caller:
        `release_workflow` it when done (a stream does so when removed). `files` is the
        policy its paths go through (the owner's by default); see WorkflowCache.compile."""
        return self.workflows.compile(workflow, where, files or self.files, unavailable)

    def release_workflow(self, workflow: CompiledWorkflow) -> None:
        """End the lease `compile_workflow` gave on the workflow's models."""
        self.workflows.release(workflow)

    def compile_stream_workflow(
        self,
        cfg: StreamConfig,
        where: str,
        files: FilePolicy | None = None,
        unavailable: frozenset[str] = frozenset(),
    ) -> CompiledWorkflow:
        return self.compile_workflow(cfg.workflow, f"{where}.workflow", files, unavailable)

    # -- managing streams at runtime ---------------------------------------------------
    @one_change_at_a_time
    def add_stream(self, cfg: StreamConfig, *, requested: bool = False) -> Stream:
        """Compile the stream's workflow and start it; StreamExistsError if the id runs,
        LimitError past limits.max_streams. A `requested` stream (over the API) has its
        files checked by the request policy, now and whenever it restarts, and is kept in
        the state: StateSaveError (it is stopped again) when it cannot be, ConfigError
        when its credentials could be kept in clear only (state.check)."""
        if requested:
            self.state.check(cfg)
        stream = self._start_stream(cfg, requested)
        if requested:
            try:
                self.state.added(cfg)
            except StateSaveError:
                self.remove_stream(cfg.id)
                raise
        # A change of the appliance's own load: the other streams' rows may wait longer.
        self.watch.changed("stream added", f"stream {cfg.id!r} added")
        return stream

    def _start_stream(self, cfg: StreamConfig, requested: bool) -> Stream:
        self.streams.check_room(cfg.id)
        self.outputs.check(cfg.outputs)
        if problem := self.hosts.refusal(cfg.source.url):  # no look-up: nothing to learn
            raise ConfigError([f"source.url: {problem}"], f"stream {cfg.id!r}")
        files = self._files_for(requested)
        workflow = self.compile_stream_workflow(cfg, f"stream {cfg.id!r}", files)
        try:
            files.check_source(cfg.source, f"stream {cfg.id!r}")
            self.shadows.check(cfg, files)
        except BaseException:
            self.release_workflow(workflow)
            raise
        stream = self.shadows.declared(self.streams.start(cfg, workflow), files)
        if requested:
            self._requested.add(cfg.id)
        return stream

    def _files_for(self, requested: bool) -> FilePolicy:
        return self.request_files if requested else self.files

    @one_change_at_a_time
    def remove_stream(
        self, stream_id: str, timeout: float = 3.0, *, requested: bool = False
    ) -> bool:
        """Stop a stream, join its threads and drop its metrics; True if they ended. A
        `requested` removal (over the API) is kept in the state first: StateSaveError
        (nothing stopped) when it cannot be."""
        if requested and not self.state.removed(stream_id, stream_id in self.streams):
            return True  # a stream of the state that could not start: forgotten
        ended = self.streams.stop(stream_id, timeout)
        self._requested.discard(stream_id)
        self.latest.forget(stream_id)
        self.watch.changed("stream removed", f"stream {stream_id!r} removed")
        return ended

    @one_change_at_a_time
    def restart_stream(self, stream_id: str, cfg: StreamConfig | None = None) -> Stream:
        """Stop and start a stream again (with `cfg` if given), recompiling its workflow
        if the workflow file changed; the new workflow is compiled before the old stops."""
        old = self.streams.find(stream_id)
        cfg = cfg or self.streams.declared.get(stream_id, old.cfg)
        files = self._files_for(stream_id in self._requested)
        workflow = self.compile_stream_workflow(cfg, f"stream {stream_id!r}", files)
        self.streams.stop(stream_id)
        self.watch.changed("restart", f"stream {stream_id!r} restarted")
        return self.shadows.declared(self.streams.start(cfg, workflow), files)

    @one_change_at_a_time
    def reload(self, dry_run: bool = False) -> ReloadPlan:
        """Apply the config file as it is now: streams added, removed or changed are
        started, stopped or restarted; unchanged ones keep running untouched. Everything
        is checked (config, models, workflows) before anything changes. A model declared
        anew (the config's, or a workflow file's own) loads beside the old one, which
        serves the streams still on it until they stop. `dry_run`: check and answer the
        plan, change nothing (models it loaded stay idle, for the apply; models loaded
        anew are dropped again)."""
        with self.watch.still():  # its model loads and restarts are not the streams' latency
            return apply_reload(self, dry_run)

    @one_change_at_a_time
    def retune(self, tuning: TuningConfig) -> Retuned:
        """Run with `tuning` (the config's `tuning:`) from now on: models change live,
        streams restart only for a source setting (appliance/runtime/retuning.py)."""
        return apply_tuning(self, tuning)

    @one_change_at_a_time
    def keep_tuning(self) -> str | None:
        """Keep the tuning that runs now (a tune applied it) in the state folder, until the
        file's `tuning:` changes; None, or why it could not be (it runs on meanwhile)."""
        return self.tuned.keep(self.config.tuning)

    # -- reads: each answered by the part that owns it ---------------------------------
    def status(self) -> RuntimeStatus:
        """Everything at once, as frozen snapshots (appliance/observe/status.py)."""
        return self._reads.status(self.started_at)

    def streams_status(self, sinks: list[SinkStatus] | None = None) -> list[StreamStatus]:
        """Every stream's status; `sinks`: the sinks' statuses when already read."""
        return self._reads.streams_status(sinks)

    def stream_status(self, stream_id: str) -> StreamStatus:
        """One stream's status; UnknownStreamError if no stream has that id."""
        return self._reads.stream_status(stream_id)

    def has_stream(self, stream_id: str) -> bool:
        return stream_id in self.streams

    def stream_regions(self, stream_id: str) -> list[Region]:
        """The lines and zones one stream's workflow counts against (for viewers to draw);
        UnknownStreamError for an unknown id."""
        return list(self.streams.find(stream_id).workflow.regions)

    def stream_latency(self, stream_id: str) -> StreamLatency:
        """One stream's recent per-block latency; UnknownStreamError for an unknown id."""
        return self._block_latency.report(stream_id)

    def slowest_frames(self, stream_id: str, since_wall: float, limit: int) -> list[SlowFrame]:
        """The stream's slowest frames captured since `since_wall` (epoch s)."""
        return self._block_latency.slowest(stream_id, since_wall, limit)

    def frame_trace(self, stream_id: str, seq: int, around: int = AROUND) -> FrameTrace:
        """Frame `seq` of a running stream and its neighbours, as a Chrome trace."""
        self.streams.find(stream_id)  # UnknownStreamError
        return self.profiler.frame_trace(stream_id, seq, around)

    def unfinished(self) -> list[str]:
        """Ids of the streams whose worker still runs (a file not yet at its end)."""
        return self.streams.unfinished()

    def wait_done(self, timeout: float | None = None) -> bool:
        """Block until every stream's worker has ended; False on timeout."""
        return self.streams.wait_done(timeout)

    def hold_video(self, stream_id: str) -> Callable[[], None]:
        """The stream draws its video (annotate, blur) until the returned release is
        called: a reader of its images for as long as it lasts (appliance/runtime/video.py)."""
        return self.video.of(stream_id).hold()

    def lease_video(self, stream_id: str, seconds: float) -> None:
        """The stream draws its video for the next `seconds` (a one-off read)."""
        self.video.of(stream_id).lease(seconds)

    def subscribe(self, fn: Subscriber, stream_id: str | None = None) -> Callable[[], None]:
        """Call `fn(result)` on the worker thread with every result (of `stream_id` only,
        if given), as the sinks get them; it must be quick. Returns the unsubscribe."""
        return self.outputs.subscribe(fn, stream_id)

    def models_status(self) -> list[ModelStatus]:
        return self.pool.describe()

    def sinks_status(self) -> list[SinkStatus]:
        return self.outputs.statuses()

    def liveness_problem(self) -> str | None:
        """None while the runtime can work; else why not (GET /health answers 503)."""
        return self._reads.liveness_problem()

    def sync_metrics(self) -> None:
        self._reads.sync_metrics()

    def metrics_text(self, openmetrics: bool = False) -> bytes:
        """The Prometheus exposition (OpenMetrics, with exemplars, if asked), counters
        owned by other threads synced first."""
        return self._reads.metrics_text(openmetrics)

    # -- the regression watch and profiling windows ----------------------------------
    def regressions(self) -> WatchReport:
        """The regression watch: the host, active regressions and their history."""
        return self.watch.report()

    def rebaseline(self, stream_id: str) -> list[str]:
        """Learn the stream's baselines again from now (after an intended change): the
        rows that start over. The watch's only change; UnknownStreamError for an unknown
        id. What runs is not touched."""
        self.streams.find(stream_id)
        try:
            return self.watch.rebaseline(stream_id)
        except KeyError:  # removed meanwhile
            raise UnknownStreamError(stream_id) from None

    def profiling_status(self) -> ProfilingStatus:
        return self.profiler.status()

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

    # -- shutdown (appliance/runtime/shutdown.py) ------------------------------------
    def stop(self, timeout: float = 5.0) -> bool:
        """Stop streams (in parallel; at once if `stop_streams` already did), the sinks,
        then models; True when every thread ended."""
        return self._shutdown.stop(timeout, announce=bool(self.started_at))

    def stop_outputs(self, timeout: float = SINK_DRAIN_S) -> bool:
        """After the streams: the sinks get up to `timeout` to send what they hold."""
        return self._shutdown.stop_outputs(timeout)

    def stop_streams(self, timeout: float) -> bool:
        """Stop supervision, profiling windows and every stream; models go on serving
        requests until `stop`. Once: a later call returns the first's result."""
        return self._shutdown.stop_streams(timeout)

    @property
    def models(self) -> Mapping[str, ModelBatcher]:
        return self.pool.handles

    def _on_batch(self, record: BatchRecord) -> None:
        """Every model batch (after its run, on the batcher thread or, inline, a
        stream's): its spans, then the watch's samples."""
        self.profiler.on_batch(record)
        self.watch.models(record)
        self._block_latency.batches(record)  # the slowest frames' model runs

    # -- supervision -------------------------------------------------------------------
    def _on_stalled(self, stream: Stream, reason: str) -> None:
        """On the supervise thread: count the stall, restart the stream (the restart is
        what helps: a fresh worker, maybe a fresh source) and abandon its stuck thread."""
        self.metrics.stream_stalls.labels(stream.id).inc()
        replaced = self.streams.get(stream.id) is not stream
        if replaced or self._stopping.is_set():
            return  # removed, restarted over the API, or shutting down: nothing to do
        restart_stalled(stream, self.restart_stream, self.metrics.threads_abandoned)
