"""Where the runtime's events become trace spans: one stream's results, one model batch.

Both are called on the thread that produced the data (the stream's worker, the thread
that ran the batch), so a stream's spans land in that thread's own buffer without a lock.
A batch's spans go on its batcher's virtual track (`Tracer.track`, named like the batcher
thread, `batch:<model>`), whichever thread ran it: an inline run (appliance/models/
batcher.py), on the stream's own thread, still shows on the model's track, its samples'
`queue.wait` spans zero-length and their flows kept. Everything a span needs besides the
run's own numbers (counter names, flow id bases, block args) is made once per stream or
model, not per frame.

Flow ids stay under 2**53 (exact as a float, and in the JavaScript that Perfetto and
chrome://tracing read them with), top bits first: bit 52 always set (clear of small ids a
viewer may hand out itself), bit 51 the kind (0 a frame, 1 a sample), 19 bits of a
CRC-32 of the stream or model id, 32 bits of the frame's seq or the model's sample count.
"""

from __future__ import annotations

import functools
import itertools
import zlib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass

from appliance.models.batcher import BatchRecord
from appliance.profiling.tracer import Tracer
from pipelines.executor import CompiledWorkflow
from pipelines.types import FrameResult

FRAME_FLOWS = 1 << 52
AGE_COUNTER = "frame_age_ms"  # `frame_age_ms:<stream>`
STREAM_COUNTERS = (AGE_COUNTER,)  # the counters named after a stream, not shared
SAMPLE_FLOWS = 1 << 52 | 1 << 51
LOW_32 = 0xFFFFFFFF


def flow_base(kind: int, key: str) -> int:
    """The high bits of every flow id of one stream (frames) or model (samples)."""
    return kind | (zlib.crc32(key.encode()) & 0x7FFFF) << 32


class StreamTrace:
    """Turns a stream's FrameResults into a workflow span with its block spans inside.

    `every_n` samples frames for very high frame rates (1: every frame). `generation`
    tells apart the streams one id had over time: a restarted stream numbers its frames
    from 0 again, and its flows must not take the ids of its predecessor's in one file.
    """

    def __init__(
        self,
        tracer: Tracer,
        stream_id: str,
        workflow: CompiledWorkflow,
        every_n: int = 1,
        generation: int = 0,
    ) -> None:
        self._tracer = tracer
        self._stream = stream_id
        self._every_n = max(1, every_n)
        self._count = 0
        self._blocks = tuple(
            (bid, {"stream": stream_id, "type": btype})
            for bid, btype in zip(workflow.block_ids, workflow.block_types, strict=True)
        )
        self._workflow = workflow.name
        self._age_counter = f"{AGE_COUNTER}:{stream_id}"  # one counter track per stream
        self._flow_base = flow_base(FRAME_FLOWS, f"{stream_id}/{generation}")
        self._stream_args = {"stream": stream_id}  # built once: the read/decode spans' args
        self._grabbing = False  # set by the first traced decode: frames then have flows

    @property
    def stream_id(self) -> str:
        return self._stream

    def grabbed(self, seq: int, start: float, received: float, end: float) -> None:
        """On the grabber thread: frame `seq` was read from start to `received` (waiting
        for the camera, demuxing) and decoded to BGR from then to `end`; a `grab` span
        holds the two (`read`, `decode`), and the frame's flow leaves it."""
        tracer = self._tracer
        if tracer.enabled and seq % self._every_n == 0:
            self._grabbing = True
            flow_id = self._flow_base | seq & LOW_32
            args = {"stream": self._stream, "seq": seq}
            tracer.span_flow_out("grab", "grab", start, end, args, flow_id)
            # A decoder that holds frames back hands over data read before this frame's
            # read began: the split is clamped into the grab span.
            received = min(max(received, start), end)
            tracer.span("read", "grab", start, received, self._stream_args)
            tracer.span("decode", "grab", received, end, self._stream_args)

    def bind(self) -> None:
        """Call on the worker thread before its first frame: its track is the stream's."""
        self._tracer.bind_stream(self._stream)

    def __call__(self, result: FrameResult) -> None:
        tracer = self._tracer
        if not tracer.enabled:
            return
        self._count += 1
        if self._count % self._every_n:
            return
        age_ms = round(result.age_seconds * 1000, 3)
        seq = result.seq
        args = {"stream": self._stream, "workflow": self._workflow, "seq": seq, "age_ms": age_ms}
        # The frame's flow ends here, unless its decode was not traced (sampling, or a
        # single image run without a grabber).
        traced = self._grabbing and seq % self._every_n == 0
        flow_id = self._flow_base | seq & LOW_32 if traced else 0
        tracer.span_flow_in(
            "workflow.run", "workflow", result.start_mono, result.done_mono, args, flow_id
        )
        for (bid, block_args), span in zip(self._blocks, result.block_spans, strict=False):
            if span is not None:
                tracer.span(bid, "block", span[0], span[1], block_args)
        tracer.counter(self._age_counter, result.done_mono, age_ms)


@dataclass(frozen=True, slots=True)
class _ModelTrace:
    """What every batch of one model reuses: its counter names and flow ids."""

    track_name: str  # the batcher thread's name: its runs' track, inline or not
    batch_counter: str
    depth_counter: str
    flow_base: int
    samples: Iterator[int]  # itertools.count: next() is atomic, for a batcher replaced live
    wait_args: dict[str, Mapping[str, str]]  # per stream, made at its first sample


@functools.cache
def _model_trace(model_id: str) -> _ModelTrace:
    # Ids never repeat in a process: a reloaded model's new batcher goes on counting.
    return _ModelTrace(
        f"batch:{model_id}",
        f"batch_size:{model_id}",  # one counter track per batcher
        f"queue_depth:{model_id}",
        flow_base(SAMPLE_FLOWS, model_id),
        itertools.count(),
        {},
    )


def trace_batch(tracer: Tracer, rec: BatchRecord) -> None:
    """A model batch: `session.run` on its batcher's track, each sample's wait for it on
    its stream's track (inside that stream's block span; zero-length for an inline run),
    and a flow from each wait to the run that served it."""
    if not tracer.enabled:
        return
    model = _model_trace(rec.model_id)
    track = tracer.track(model.track_name, rec.batcher)
    start = rec.run_start
    run_args: dict[str, object] = {
        "model": rec.model_id,
        "batch_size": rec.batch_size,
        "streams": list(rec.stream_ids),
        "ok": rec.ok,
    }
    if rec.ort_profiled:  # in a profiling window: this run's operators are in the trace
        run_args["ort_profiled"] = True
    if rec.inline:  # on the stream's thread: no hand-off to the batcher and back
        run_args["inline"] = True
    tracer.span("session.run", "model", start, start + rec.run_s, run_args, track)
    tracer.counter(model.batch_counter, start, rec.batch_size, track)
    tracer.counter(model.depth_counter, start, rec.queue_depth, track)
    for stream, wait in zip(rec.stream_ids, rec.queue_wait_s, strict=True):
        flow_id = model.flow_base | next(model.samples) & LOW_32
        args = model.wait_args.get(stream)
        if args is None:
            args = model.wait_args[stream] = {"model": rec.model_id, "stream": stream}
        tracer.span_for_stream(
            stream, "queue.wait", "queue", start - wait, start, args, flow_id, track
        )


class SinkDeliveries:
    """A sink's deliveries of frames' results as `deliver` spans (publish to ack, request
    to answer), with the frame's stream and seq: a frame's trace shows when each sink got
    it through (appliance/profiling/frametrace.py).

    Deliveries overlap (QoS 1 publishes are pipelined; a webhook has several requests in
    flight), and spans on one track must nest: each goes on the first of the sink's
    tracks (`sink:<name>`, instances 0, 1, ...) whose last span ended before it began.
    Called on the sink's event loop only, so the lanes need no lock."""

    def __init__(self, tracer: Tracer, sink: str) -> None:
        self._tracer = tracer
        self._sink = sink
        self._track = f"sink:{sink}"
        self._ends: list[float] = []  # each lane's latest end, perf_counter s

    def __call__(self, stream: str, seq: int, start: float, end: float) -> None:
        tracer = self._tracer
        if not tracer.enabled:
            return
        ends = self._ends
        lane = next((i for i, last in enumerate(ends) if last <= start), len(ends))
        if lane == len(ends):
            ends.append(end)
        else:
            ends[lane] = max(ends[lane], end)
        args = {"sink": self._sink, "stream": stream, "seq": seq}
        tracer.span("deliver", "sink", start, end, args, tracer.track(self._track, lane))
