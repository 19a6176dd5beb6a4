"""The streams that run, by id, and what each is wired to while it runs.

`RunningStreams` is the runtime's table of streams: a read-only mapping (id -> Stream) for
everyone, changed only by the runtime (appliance/runtime/runtime.py, and the reload it
applies) through `start` and `stop`, under one lock, so that an id is checked and taken in
one step. Starting a stream builds it on a workflow compiled and leased for it, with the
config's `tuning:` over its source, and wires it up: its publisher and state changes to
the outputs, its metrics, its trace, its rows in the block latency table and in the
regression watch. Stopping it undoes each and ends the workflow's lease.

Reads go over a copy: a stream may start or stop meanwhile.
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from collections.abc import Callable, ItemsView, Iterator, Mapping, ValuesView

from appliance.config import AppConfig, StreamConfig
from appliance.errors import LimitError, StreamExistsError, UnknownStreamError
from appliance.models.threads import block_cpu_ns
from appliance.observe.blocklatency import BlockLatencies
from appliance.observe.metrics import Metrics, StreamMetrics
from appliance.policy.hosts import SourceHosts
from appliance.profiling.hooks import StreamTrace
from appliance.profiling.tracer import Tracer
from appliance.runtime.outputs import Outputs
from appliance.runtime.streamparts import Switch
from appliance.runtime.streams import Stream
from appliance.runtime.video import VideoDemands
from appliance.sources.config import SourceTuning
from appliance.watch.watch import Watch
from pipelines.executor import CompiledWorkflow, WorkflowRun

log = logging.getLogger("appliance.runtime")


class RunningStreams(Mapping[str, Stream]):
    """The running streams by id; `start` and `stop` are the runtime's alone.

    `config` returns the runtime's config as it is now (a reload or a retune replaces it):
    a stream starts with its `tuning:`, paths and trace sampling. `release` ends a
    workflow's lease (the runtime's WorkflowCache)."""

    def __init__(
        self,
        config: Callable[[], AppConfig],
        *,
        outputs: Outputs,
        metrics: Metrics,
        tracer: Tracer,
        hosts: SourceHosts,
        block_latency: BlockLatencies,
        watch: Watch,
        release: Callable[[CompiledWorkflow], None],
        max_streams: int,
        max_frames: int | None = None,
        video: VideoDemands | None = None,
    ) -> None:
        self._config = config
        self._outputs = outputs
        self._metrics = metrics
        self._tracer = tracer
        self._hosts = hosts  # the hosts a source may reach
        self._block_latency = block_latency
        self._watch = watch
        self._release = release
        self.video = video or VideoDemands()  # who reads each stream's video
        self._max_streams = max_streams
        self._max_frames = max_frames
        self._streams: dict[str, Stream] = {}
        self._declared: dict[str, StreamConfig] = {}  # each one's, before `tuning:`
        self._lock = threading.Lock()  # the table and the id checks
        self._generations = itertools.count()  # each started stream's number

    # -- the mapping: anyone reads -----------------------------------------------------
    def __getitem__(self, stream_id: str) -> Stream:
        return self._streams[stream_id]

    def __iter__(self) -> Iterator[str]:
        return iter(list(self._streams))

    def __len__(self) -> int:
        return len(self._streams)

    # A copy's views: one taken in a step, safe while streams start and stop.
    def items(self) -> ItemsView[str, Stream]:
        return dict(self._streams).items()

    def values(self) -> ValuesView[Stream]:
        return dict(self._streams).values()

    @property
    def declared(self) -> Mapping[str, StreamConfig]:
        """Each running stream's config as declared, before `tuning:`."""
        return self._declared

    def running(self) -> list[Stream]:
        """Every running stream, as a list of its own."""
        return list(self._streams.values())

    def find(self, stream_id: str) -> Stream:
        """The stream with that id; UnknownStreamError if none runs."""
        stream = self._streams.get(stream_id)
        if stream is None:
            raise UnknownStreamError(stream_id)
        return stream

    # -- the runtime's changes ---------------------------------------------------------
    def check_room(self, stream_id: str) -> None:
        """StreamExistsError if the id runs, LimitError past limits.max_streams."""
        with self._lock:
            self._check_room(stream_id)

    def start(self, cfg: StreamConfig, workflow: CompiledWorkflow) -> Stream:
        """Start a stream on a workflow leased for it; the lease is the stream's now."""
        try:
            self.check_room(cfg.id)  # checked again here: the id may have been taken since
        except BaseException:
            self._release(workflow)
            raise
        blocks = list(zip(workflow.block_ids, workflow.block_types, strict=True))
        config = self._config()
        declared, cfg = cfg, tuned_stream(cfg, config.tuning.sources)
        always = cfg.draw == "always" or self._outputs.sends_images(cfg.outputs)
        trace = self._trace(cfg.id, workflow, config)
        stream = Stream(
            cfg,
            workflow,
            self._outputs.publisher(cfg.id, cfg.outputs),
            StreamMetrics(self._metrics, cfg.id, blocks),
            config.resolve,
            max_frames=self._max_frames,
            trace=trace,
            on_state=self._outputs.stream_state,
            hosts=self._hosts,
            cpu_clock=block_cpu_ns if config.profiling.watch.enabled else None,
            video=None if always else self.video.of(cfg.id),
        )
        with self._lock:
            self._check_room(cfg.id)
            self._streams[cfg.id] = stream
            self._declared[cfg.id] = declared
        self._attach(cfg.id, workflow, blocks)
        stream.start()
        return stream

    def redeclare(self, cfg: StreamConfig) -> None:
        """The running stream is this from now on (a shadow started, stopped or promoted
        over the API): what its restarts start."""
        with self._lock:
            if cfg.id in self._declared:
                self._declared[cfg.id] = cfg

    def stop(self, stream_id: str, timeout: float = 3.0) -> bool:
        """Stop a stream, join its threads, unwire it and end its workflow's lease; True if
        its threads ended. UnknownStreamError if none runs with that id."""
        with self._lock:
            stream = self._streams.pop(stream_id, None)
            self._declared.pop(stream_id, None)
        if stream is None:
            raise UnknownStreamError(stream_id)
        ended = stream.stop(timeout)
        self._block_latency.detach(stream_id)
        self._watch.detach(stream_id)
        self._release(stream.workflow)
        stream.metrics.remove()
        log.info("stream %s removed", stream_id)
        return ended

    def switch(
        self,
        stream_id: str,
        workflow: CompiledWorkflow,
        run: WorkflowRun | None = None,
        timeout: float = 5.0,
    ) -> tuple[CompiledWorkflow, bool]:
        """Run `workflow` (leased for the stream: the lease is its now) on a running
        stream from its next frame on, with `run`'s block state if given: no frame lost,
        the grabber and its sequence numbers untouched. Its per-block metrics, trace
        track and watch rows follow. Returns the workflow it ran (its lease is the
        caller's now) and whether the worker took the new one within `timeout` (else it
        does at its next frame)."""
        stream = self.find(stream_id)
        blocks = list(zip(workflow.block_ids, workflow.block_types, strict=True))
        trace = self._trace(stream_id, workflow, self._config())
        previous, old_metrics = stream.workflow, stream.metrics
        change = Switch(workflow, run, StreamMetrics(self._metrics, stream_id, blocks), trace)
        stream.switch(change)
        applied = change.done.wait(timeout)
        self._block_latency.detach(stream_id)
        self._watch.detach(stream_id)
        self._attach(stream_id, workflow, blocks)
        old_metrics.remove_blocks(keep=blocks)
        log.info("stream %s: workflow %s from now on", stream_id, workflow.version)
        return previous, applied

    def _trace(self, stream_id: str, workflow: CompiledWorkflow, config: AppConfig) -> StreamTrace:
        """The profiler's per-frame hook of a stream running `workflow`."""
        return StreamTrace(
            self._tracer,
            stream_id,
            workflow,
            config.profiling.sample_every_n_frames,
            next(self._generations),  # a restart's frame flows get ids of their own
        )

    def _attach(
        self, stream_id: str, workflow: CompiledWorkflow, blocks: list[tuple[str, str]]
    ) -> None:
        """The per-block views of a stream running `workflow`: latency and watch rows."""
        self._block_latency.attach(stream_id, blocks)
        self._watch.attach(
            stream_id,
            workflow.block_ids,
            workflow.block_models,
            on_demand=[workflow.block_ids[i] for i in workflow.video_only],
        )

    def _check_room(self, stream_id: str) -> None:
        """Under the lock."""
        if stream_id in self._streams:
            raise StreamExistsError(stream_id)
        if len(self._streams) >= self._max_streams:
            running = f"{len(self._streams)} streams run"
            raise LimitError("limits.max_streams", self._max_streams, running)

    # -- what they say -----------------------------------------------------------------
    def unfinished(self) -> list[str]:
        """Ids of the streams whose worker still runs (a file not yet at its end)."""
        return [s.id for s in self.running() if not s.done.is_set()]

    def wait_done(self, timeout: float | None = None) -> bool:
        """Block until every stream's worker has ended; False on timeout."""
        deadline = None if timeout is None else time.monotonic() + timeout
        for stream in self.running():
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            if not stream.done.wait(left):
                return False
        return True

    def stalled(self) -> dict[str, str]:
        """Stream id -> why it stalled, while its restarted stream has processed nothing."""
        return {s.id: reason for s in self.running() if (reason := s.stall)}


def tuned_stream(cfg: StreamConfig, tuning: SourceTuning) -> StreamConfig:
    """The stream as declared, with the tuning's source settings over its own."""
    update = {k: v for k, v in tuning if v is not None}
    source = cfg.source.model_copy(update=update) if update else cfg.source
    return cfg if source == cfg.source else cfg.model_copy(update={"source": source})
