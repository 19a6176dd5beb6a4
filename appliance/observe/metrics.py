"""Prometheus metrics of one runtime, in a registry of its own (several runtimes may live
in one process, e.g. in tests).

Label values come from configuration only (stream ids, block ids, model ids), never from
data, so cardinality is bounded by streams × blocks. Children are bound once per stream
(`StreamMetrics`) so the per-frame path does no label lookups.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Sequence
from typing import Literal

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from appliance.observe.exemplars import FrameTags, Sampled, upper_bounds
from pipelines.types import FrameResult

# Video work spans sub-millisecond blocks to multi-second stalls: 0.5 ms .. 2 s. (Kept as a
# table: one bound per line would hide the spacing of the bounds.)
LATENCY_BUCKETS: tuple[float, ...] = (
    0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.035, 0.05, 0.075,
    0.1, 0.15, 0.25, 0.5, 1.0, 2.0,
)  # fmt: skip
BATCH_BUCKETS: tuple[float, ...] = (1, 2, 3, 4, 6, 8, 12, 16, 32, 64)
# The `stage` label values of appliance_model_stage_seconds, in the order a run goes
# through them (appliance/profiling/operators.py says what each holds).
ModelStage = Literal["h2d", "compute", "d2h"]
MODEL_STAGES: tuple[ModelStage, ...] = ("h2d", "compute", "d2h")


# Also the help of the `serve --workers` gateway's own family (its connection refusals).
LIMIT_HITS_HELP = "Requests and connections refused by a configured limit (limits.*)."


class Metrics:
    """Every metric the appliance exports, registered in `self.registry`."""

    def __init__(self, buckets: Sequence[float] = LATENCY_BUCKETS, exemplars: bool = True) -> None:
        # Exemplars on the latency histograms (appliance/observe/exemplars.py): the frame
        # behind a bucket; `tags` says what else they name (the runtime wires its parts).
        self.exemplars = exemplars
        self.tags = FrameTags()
        r = self.registry = CollectorRegistry(auto_describe=True)
        # Every family in this registry; latency histograms share the configured buckets.
        histogram = functools.partial(Histogram, registry=r, buckets=tuple(buckets))
        counter = functools.partial(Counter, registry=r)
        gauge = functools.partial(Gauge, registry=r)
        self.block_latency = histogram(
            "appliance_block_latency_seconds",
            "Run time of one workflow block: the stream's live workflow (variant live), or "
            "its shadow's candidate on the same frames (variant shadow, docs/shadow.md).",
            ["stream", "block", "type", "variant"],
        )
        self.workflow_latency = histogram(
            "appliance_workflow_latency_seconds", "Run time of a whole workflow.", ["stream"]
        )
        self.frame_age = histogram(
            "appliance_frame_age_seconds", "Frame capture to result published.", ["stream"]
        )
        self.model_inference = histogram(
            "appliance_model_inference_seconds", "session.run time of one batch.", ["model"]
        )
        self.model_queue = histogram(
            "appliance_model_queue_seconds", "Wait of a sample in a model's batch queue.", ["model"]
        )
        self.model_stage = histogram(
            "appliance_model_stage_seconds",
            "Node time of one session.run per stage: h2d (MemcpyFromHost), compute, d2h "
            "(MemcpyToHost), from ONNX Runtime's profiler: observed only for the runs a "
            "profiling window with ort_operators profiled (sampled), never for the others. "
            "A model on the CPU provider has compute only (it copies nothing).",
            ["model", "stage"],
        )
        self.model_batch_size = histogram(
            "appliance_model_batch_size",
            "Samples per session.run.",
            ["model"],
            buckets=BATCH_BUCKETS,
        )
        self.frames = counter(
            "appliance_frames",
            "Frames by outcome: processed, dropped (overwritten "
            "before a worker took them) or failed (the workflow raised).",
            ["stream", "outcome"],
        )
        self.stream_up = gauge("appliance_stream_up", "1 while the stream is running.", ["stream"])
        self.reconnects = counter(
            "appliance_stream_reconnects", "Reconnect attempts of a live source.", ["stream"]
        )
        self.trace_files = counter("appliance_trace_files_written", "Rolling trace files written.")
        self.trace_errors = counter(
            "appliance_trace_write_errors", "Trace files that could not be written."
        )
        self.window_active = gauge(
            "appliance_profiling_window_active", "1 while a profiling window runs."
        )
        self.webrtc_sessions = gauge(
            "appliance_webrtc_sessions", "Open WebRTC viewer sessions.", ["stream"]
        )
        self.webrtc_frames_sent = counter(
            "appliance_webrtc_frames_sent", "Video frames handed to WebRTC encoders.", ["stream"]
        )
        self.webrtc_skipped = counter(
            "appliance_webrtc_datachannel_skipped",
            "Predictions not sent: the viewer's data channel buffer was full.",
            ["stream"],
        )
        self.limit_hits = counter("appliance_limit_hits", LIMIT_HITS_HELP, ["limit"])
        self.file_refusals = counter(
            "appliance_file_refusals", "Files refused by the access policy, by kind.", ["kind"]
        )
        self.source_fps = gauge(
            "appliance_source_fps", "Frames per second decoded from the source.", ["stream"]
        )
        # Not part of StreamMetrics: a stalled stream is restarted, which drops its
        # series, and the stall must outlive that. Ids come from the config or the API.
        self.stream_stalls = counter(
            "appliance_stream_stalls",
            "Streams found stalled (a worker or read busy longer "
            "than limits.worker_stall_s) and restarted.",
            ["stream"],
        )
        self.threads_abandoned = counter(
            "appliance_threads_abandoned",
            "Stuck threads left behind (daemon threads that "
            "end on their own, if ever) when their stream was restarted.",
        )

        self.sink_messages = counter(
            "appliance_sink_messages",
            "Messages by outcome: sent, retried, dropped (queue "
            "overflow or shutdown) or dead_lettered (webhook retries exhausted).",
            ["sink", "outcome"],
        )
        self.sink_queue_depth = gauge(
            "appliance_sink_queue_depth", "Messages waiting in a sink's queue.", ["sink"]
        )
        self.sink_send_seconds = histogram(
            "appliance_sink_send_seconds",
            "One delivery: publish to PUBACK, or HTTP request.",
            ["sink"],
        )
        self.result_reads = counter(
            "appliance_result_reads",
            "Results read over HTTP: latest, snapshot, and the event and MJPEG streams opened.",
            ["kind"],
        )
        self.sink_up = gauge(
            "appliance_sink_up", "1 while the sink is connected or delivering.", ["sink"]
        )
        self._watch_metrics(r)

    def _watch_metrics(self, r: CollectorRegistry) -> None:
        """The regression watch's (appliance/watch/rows.py sets them)."""
        counter = functools.partial(Counter, registry=r)
        gauge = functools.partial(Gauge, registry=r)
        self.block_regression = gauge(
            "appliance_block_regression",
            "1 while the regression watch holds the block "
            "slower than its baseline (beyond what a host slowdown explains).",
            ["stream", "block"],
        )
        self.block_regression_ratio = gauge(
            "appliance_block_regression_ratio",
            "The block's median over its baseline's, "
            "host slowdown taken out, at the watch's latest comparison.",
            ["stream", "block"],
        )
        self.model_regression = gauge(
            "appliance_model_regression",
            "1 while a model's session.run is slower than its baseline.",
            ["model"],
        )
        self.model_regression_ratio = gauge(
            "appliance_model_regression_ratio",
            "A model's session.run median over its baseline's, host slowdown taken out.",
            ["model"],
        )
        self.host_slowdown = gauge(
            "appliance_host_slowdown",
            "1 while the host is slower as a whole than when "
            "the baselines were learned (probe and rows agree).",
        )
        self.host_slowdown_ratio = gauge(
            "appliance_host_slowdown_ratio",
            "The host factor at the latest comparison (1: nothing put on the host).",
        )
        self.watch_comparisons = counter(
            "appliance_watch_comparisons", "Rows judged against their baseline."
        )
        self.regressions = counter(
            "appliance_regressions",
            "Regressions raised by the watch, by kind (block, model, queue, frame age, host).",
            ["kind"],
        )
        self.watch_contention = counter(
            "appliance_watch_contention_events",
            "Times rows got slower only by waiting (their own CPU cost per run unchanged), "
            "by type: contention, or load_changed when a change of load explains them.",
            ["type"],
        )
        self.watch_probe_cpu = counter(
            "appliance_watch_probe_cpu_seconds",
            "CPU time the regression watch's host probe has used (its own cost).",
        )

    def sampled(self, histogram: Histogram, *labels: str) -> Sampled | None:
        """A child of `histogram` whose buckets keep recent exemplars; None when
        exemplars are off (observe the plain child then)."""
        if not self.exemplars:
            return None
        return Sampled(histogram.labels(*labels), upper_bounds(histogram))

    def remove_model(self, model_id: str) -> None:
        """Drop a released model's series: API workflows may name any number of models."""
        for histogram in (self.model_inference, self.model_queue, self.model_batch_size):
            _remove(histogram, model_id)
        for stage in MODEL_STAGES:
            _remove(self.model_stage, model_id, stage)
        for gauge in (self.model_regression, self.model_regression_ratio):
            _remove(gauge, model_id)


LIVE, SHADOW = "live", "shadow"  # the block latency's variants


class StreamMetrics:
    """One stream's metric children, bound once when the stream starts."""

    def __init__(self, metrics: Metrics, stream_id: str, blocks: Sequence[tuple[str, str]]) -> None:
        self._metrics = metrics
        self._id = stream_id
        self._block_labels = tuple(blocks)
        m = metrics
        self.blocks = BlockLatency(m, stream_id, blocks, LIVE)
        self.workflow = m.workflow_latency.labels(stream_id)
        self.age = m.frame_age.labels(stream_id)
        self.tags = m.tags
        self._sampled = (
            m.sampled(m.workflow_latency, stream_id),
            m.sampled(m.frame_age, stream_id),
        )
        if m.exemplars:
            self.observe = self._observe_sampled  # type: ignore[method-assign]
        self.processed = m.frames.labels(stream_id, "processed")
        self.dropped = m.frames.labels(stream_id, "dropped")
        self.failed = m.frames.labels(stream_id, "failed")
        self.up = m.stream_up.labels(stream_id)
        self.reconnects = m.reconnects.labels(stream_id)
        self.source_fps = m.source_fps.labels(stream_id)

    def observe(self, result: FrameResult) -> None:
        """Per frame: every block's time, the workflow's, the frame's age."""
        self.blocks.observe(result)
        self.workflow.observe(result.done_mono - result.start_mono)
        self.age.observe(result.age_seconds)
        self.processed.inc()

    def _observe_sampled(self, result: FrameResult) -> None:
        """`observe`, each bucket keeping a recent frame as its exemplar."""
        done, tags, sid, seq = result.done_mono, self.tags, self._id, result.seq
        self.blocks.observe(result)
        workflow, age = self._sampled
        assert workflow is not None and age is not None  # made when exemplars are on
        workflow.observe(done - result.start_mono, done, tags, sid, seq)
        age.observe(result.age_seconds, done, tags, sid, seq)
        self.processed.inc()

    def remove_blocks(self, keep: Sequence[tuple[str, str]] = ()) -> None:
        """Drop the series of this stream's blocks but those in `keep` (another workflow's
        blocks: the stream switched to it)."""
        m, sid = self._metrics, self._id
        for block, btype in set(self._block_labels) - set(keep):
            _remove(m.block_latency, sid, block, btype, LIVE)
            _remove(m.block_regression, sid, block)
            _remove(m.block_regression_ratio, sid, block)

    def remove(self) -> None:
        """Drop this stream's series so /metrics does not report a removed stream."""
        m, sid = self._metrics, self._id
        self.remove_blocks()  # the watch's block series too: it sets them again if it runs
        for metric in (m.workflow_latency, m.frame_age, m.stream_up, m.reconnects, m.source_fps):
            _remove(metric, sid)
        for outcome in ("processed", "dropped", "failed"):
            _remove(m.frames, sid, outcome)


class BlockLatency:
    """One workflow's per-block latency children on a stream, of one variant: `live`
    (StreamMetrics) or `shadow` (a shadow's candidate, appliance/runtime/shadow.py)."""

    def __init__(
        self, metrics: Metrics, stream_id: str, blocks: Sequence[tuple[str, str]], variant: str
    ) -> None:
        self._metric = metrics.block_latency
        self._labels = [(stream_id, b, t, variant) for b, t in blocks]
        self.children = tuple(self._metric.labels(*labels) for labels in self._labels)
        self._stream, self._tags = stream_id, metrics.tags
        if metrics.exemplars:
            bounds = upper_bounds(self._metric)
            self._sampled = tuple(Sampled(child, bounds) for child in self.children)
            self.observe = self._observe_sampled  # type: ignore[method-assign]

    def observe(self, result: FrameResult) -> None:
        """Per frame: each block's run time (a block skipped on the frame is not)."""
        for child, span in zip(self.children, result.block_spans, strict=False):
            if span is not None:
                child.observe(span[1] - span[0])

    def _observe_sampled(self, result: FrameResult) -> None:
        """`observe`, each bucket keeping a recent frame as its exemplar."""
        done, tags, sid, seq = result.done_mono, self._tags, self._stream, result.seq
        for child, span in zip(self._sampled, result.block_spans, strict=False):
            if span is not None:
                child.observe(span[1] - span[0], done, tags, sid, seq)

    def remove(self) -> None:
        for labels in self._labels:
            _remove(self._metric, *labels)


def _remove(metric: Histogram | Counter | Gauge, *labels: str) -> None:
    with contextlib.suppress(KeyError):  # never observed: nothing to drop
        metric.remove(*labels)
