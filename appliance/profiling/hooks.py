"""Where the runtime's events become trace spans: one stream's results, one model batch.

Both are called on the thread that produced the data (the stream's worker, the model's
batcher), so every span lands in that thread's own buffer without a lock.
"""

from __future__ import annotations

import zlib

from appliance.models.batcher import BatchRecord
from appliance.profiling.tracer import Tracer
from pipelines.executor import CompiledWorkflow
from pipelines.types import FrameResult


class StreamTrace:
    """Turns a stream's FrameResults into a workflow span with its block spans inside.

    `every_n` samples frames for very high frame rates (1: every frame).
    """

    def __init__(
        self, tracer: Tracer, stream_id: str, workflow: CompiledWorkflow, every_n: int = 1
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
        # flow id = 21 bits of the stream, 32 of the seq: under 2**53, exact as a float and
        # in the JavaScript that Perfetto and chrome://tracing read it with.
        self._flow_base = (zlib.crc32(stream_id.encode()) & 0x1FFFFF) << 32

    def grabbed(self, seq: int, start: float, end: float) -> None:
        """On the grabber thread: reading and decoding frame `seq` took start..end."""
        tracer = self._tracer
        if tracer.enabled and seq % self._every_n == 0:
            tracer.span("grab", "grab", start, end, {"stream": self._stream, "seq": seq})
            tracer.flow("s", self._flow_base | seq & 0xFFFFFFFF, (start + end) / 2)

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
        tracer.flow("f", self._flow_base | result.seq & 0xFFFFFFFF, result.start_mono)
        tracer.span("workflow.run", "workflow", result.start_mono, result.done_mono,
                    {"stream": self._stream, "workflow": self._workflow, "seq": result.seq,
                     "age_ms": age_ms})  # fmt: skip
        for (bid, args), span in zip(self._blocks, result.block_spans, strict=False):
            if span is not None:
                tracer.span(bid, "block", span[0], span[1], args)
        tracer.counter("frame_age_ms", result.done_mono, age_ms)


def trace_batch(tracer: Tracer, rec: BatchRecord) -> None:
    """A model batch: `session.run` on the batcher's track, each sample's wait for it on
    its stream's track (inside that stream's block span)."""
    if not tracer.enabled:
        return
    end = rec.run_start + rec.run_s
    tracer.span("session.run", "model", rec.run_start, end,
                {"model": rec.model_id, "batch_size": rec.batch_size,
                 "streams": list(rec.stream_ids), "ok": rec.ok})  # fmt: skip
    tracer.counter("batch_size", rec.run_start, rec.batch_size)
    tracer.counter(f"queue_depth:{rec.model_id}", rec.run_start, rec.queue_depth)
    for stream, wait in zip(rec.stream_ids, rec.queue_wait_s, strict=True):
        tracer.span_for_stream(stream, "queue.wait", "queue", rec.run_start - wait, rec.run_start,
                               {"model": rec.model_id, "stream": stream})  # fmt: skip
