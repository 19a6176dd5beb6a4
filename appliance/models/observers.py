"""A model's per-batch metrics: what the pool hands each batcher as its `on_batch`, the
histograms observed first, then the runtime's hook (its trace spans, the watch)."""

from __future__ import annotations

from collections.abc import Callable

from appliance.models.batches import BatchRecord
from appliance.observe.exemplars import FrameTags, Observer, Sampled
from appliance.observe.metrics import Metrics

OnBatch = Callable[[BatchRecord], None]


def batch_observer(metrics: Metrics, model_id: str, on_batch: OnBatch | None) -> OnBatch:
    """Observe each run's time, size and waits under `model_id`, then call `on_batch`."""
    m = metrics
    size = m.model_batch_size.labels(model_id)
    sampled_run = m.sampled(m.model_inference, model_id)
    sampled_queue = m.sampled(m.model_queue, model_id)
    if sampled_run is not None and sampled_queue is not None:
        return _sampled(m.tags, sampled_run, sampled_queue, size, on_batch)
    run = m.model_inference.labels(model_id)
    queue = m.model_queue.labels(model_id)

    def observe(rec: BatchRecord) -> None:
        run.observe(rec.run_s)
        size.observe(rec.batch_size)
        for wait in rec.queue_wait_s:
            queue.observe(wait)
        if on_batch is not None:
            on_batch(rec)

    return observe


def _sampled(
    tags: FrameTags, run: Sampled, queue: Sampled, size: Observer, on_batch: OnBatch | None
) -> OnBatch:
    """`batch_observer` with exemplars: a run's names the frame its first sample came
    from, a wait's the frame of its own stream (each stream's frame in work,
    `tags.working`; none before its worker took one)."""
    working = tags.working

    def observe(rec: BatchRecord) -> None:
        streams, end = rec.stream_ids, rec.run_start + rec.run_s
        first = streams[0] if streams else ""
        run.observe(rec.run_s, end, tags, first, working.get(first, -1))
        size.observe(rec.batch_size)
        for stream, wait in zip(streams, rec.queue_wait_s, strict=False):
            queue.observe(wait, end, tags, stream, working.get(stream, -1))
        if on_batch is not None:
            on_batch(rec)

    return observe
