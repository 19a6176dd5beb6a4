"""ModelBatcher with real models and ONNX Runtime: batching rules, results, failures, stop.

Samples are often queued before `start()` so that what one batch holds is decided by the
rules, not by thread timing.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import cast

import numpy as np
import onnxruntime as ort
import pytest

from appliance.models import (
    BatchRecord,
    LoadedModel,
    ModelBatcher,
    ModelRunError,
    ModelStoppedError,
)
from pipelines.models import Tensor
from pipelines.spec import BatchingSpec
from tests.models.conftest import TIMEOUT_S, load_cpu, outputs_of

MakeBatcher = Callable[..., tuple[ModelBatcher, list[BatchRecord]]]


@pytest.fixture
def make_batcher() -> Iterator[MakeBatcher]:
    """Builds batchers that record every batch; all are stopped at teardown."""
    made: list[ModelBatcher] = []

    def make(
        model: LoadedModel, max_batch_size: int, max_queue_delay_ms: float, start: bool = True
    ) -> tuple[ModelBatcher, list[BatchRecord]]:
        records: list[BatchRecord] = []
        batching = BatchingSpec(
            max_batch_size=max_batch_size, max_queue_delay_ms=max_queue_delay_ms
        )
        batcher = ModelBatcher(model, batching, on_batch=records.append)
        made.append(batcher)
        if start:
            batcher.start()
        return batcher, records

    yield make
    for batcher in made:
        batcher.stop()


def _direct(model: LoadedModel, sample: Tensor) -> list[Tensor]:
    outputs = model.session.run(model.output_names, {model.input_name: sample[None]})
    return [o[0] for o in outputs]


def _assert_close(got: Tensor, want: Tensor) -> None:
    np.testing.assert_allclose(got.astype(np.float64), want.astype(np.float64), atol=1e-4)


def test_full_batch_is_dispatched_without_waiting_for_the_delay(
    person: LoadedModel, frames: list[Tensor], make_batcher: MakeBatcher
) -> None:
    batcher, records = make_batcher(person, max_batch_size=4, max_queue_delay_ms=1000)
    streams = [f"cam{i}" for i in range(4)]
    barrier = threading.Barrier(4)

    def submit(stream: str) -> Future[Sequence[Tensor]]:
        barrier.wait(TIMEOUT_S)
        return batcher.submit(frames[0], stream)

    with ThreadPoolExecutor(4) as pool:
        futures = list(pool.map(submit, streams))
    outputs_of(futures)

    assert len(records) == 1
    assert records[0].batch_size == 4
    assert sorted(records[0].stream_ids) == streams
    assert max(records[0].queue_wait_s) < 1.0  # the 1000 ms delay did not elapse
    batch_threads = [t for t in threading.enumerate() if t.name == "batch:person"]
    assert len(batch_threads) == 1 and not batch_threads[0].daemon


def test_partial_batch_is_dispatched_after_the_delay(
    person: LoadedModel, frames: list[Tensor], make_batcher: MakeBatcher
) -> None:
    batcher, records = make_batcher(person, max_batch_size=4, max_queue_delay_ms=150)

    outputs_of([batcher.submit(frames[0], "a"), batcher.submit(frames[1], "b")])

    assert [(r.batch_size, r.stream_ids) for r in records] == [(2, ("a", "b"))]
    assert records[0].queue_wait_s[0] >= 0.150  # the oldest sample waited out the delay


def test_once_every_producer_waits_the_batch_goes_without_the_delay(
    person: LoadedModel, frames: list[Tensor], make_batcher: MakeBatcher
) -> None:
    batcher, records = make_batcher(person, max_batch_size=4, max_queue_delay_ms=1000)
    batcher.set_producers(1)  # one stream: no sample can keep it company
    outputs_of([batcher.submit(frames[0], "alone")])
    batcher.set_producers(2)
    outputs_of([*batcher.submit_many(frames[:2], "crops"), batcher.submit(frames[2], "other")])
    batcher.set_producers(2)
    outputs_of([batcher.submit(frames[0], "a")])  # the other producer is quiet: the delay runs

    assert [(r.batch_size, r.stream_ids) for r in records] == [
        (1, ("alone",)), (3, ("crops", "crops", "other")), (1, ("a",))
    ]  # fmt: skip
    # A frame's crops queue at once: the two producers' samples went as one batch, and
    # neither waited for the 1000 ms delay; the last batch did.
    assert max(records[0].queue_wait_s + records[1].queue_wait_s) < 0.5
    assert records[2].queue_wait_s[0] >= 1.0


def test_zero_delay_takes_whatever_is_waiting(
    person: LoadedModel, frames: list[Tensor], make_batcher: MakeBatcher
) -> None:
    batcher, records = make_batcher(person, max_batch_size=4, max_queue_delay_ms=0, start=False)
    queued = [batcher.submit(f, f"s{i}") for i, f in enumerate(frames)]
    batcher.start()
    outputs_of(queued)
    outputs_of([batcher.submit(frames[0], "alone")])

    assert [r.batch_size for r in records] == [3, 1]
    assert records[1].stream_ids == ("alone",)
    assert (batcher.batches, batcher.samples) == (2, 4)


def test_batched_outputs_equal_per_sample_runs(
    person: LoadedModel, frames: list[Tensor], make_batcher: MakeBatcher
) -> None:
    batcher, records = make_batcher(person, max_batch_size=4, max_queue_delay_ms=0, start=False)
    futures = [batcher.submit(f) for f in frames]
    batcher.start()
    results = outputs_of(futures)

    assert [r.batch_size for r in records] == [3]
    for frame, result in zip(frames, results, strict=True):
        expected = _direct(person, frame)
        assert [o.shape for o in result] == [e.shape for e in expected]  # no batch dim
        assert result[1].shape == (100, 4)  # detection_boxes of one sample
        for got, want in zip(result, expected, strict=True):
            _assert_close(got, want)


def test_fixed_batch_model_is_fed_one_sample_per_run(
    yolov8_fixed_batch_model: Path, make_batcher: MakeBatcher
) -> None:
    yolo = load_cpu("fall", yolov8_fixed_batch_model, decoder="yolo")
    rng = np.random.default_rng(0)
    samples = [rng.random((3, 640, 640), dtype=np.float32) for _ in range(3)]
    batcher, records = make_batcher(yolo, max_batch_size=4, max_queue_delay_ms=0, start=False)
    futures = [batcher.submit(s, f"s{i}") for i, s in enumerate(samples)]
    batcher.start()
    results = outputs_of(futures)

    assert [(r.batch_size, r.stream_ids) for r in records] == [(1, (f"s{i}",)) for i in range(3)]
    for sample, (output,) in zip(samples, results, strict=True):
        assert output.shape == (6, 8400)
        _assert_close(output, _direct(yolo, sample)[0])


def test_short_chunk_of_a_fixed_batch_is_zero_padded(
    doubling_model_path: Path, make_batcher: MakeBatcher
) -> None:
    double = load_cpu("double", doubling_model_path)  # y = x + x, batch fixed at 2
    samples = [np.full(3, i, dtype=np.float32) for i in (1, 2, 3)]
    batcher, records = make_batcher(double, max_batch_size=4, max_queue_delay_ms=0, start=False)
    futures = [batcher.submit(s) for s in samples]
    batcher.start()
    results = outputs_of(futures)

    assert [r.batch_size for r in records] == [2, 1]  # runs of 2: [1, 2] and [3, pad]
    assert [r[0].tolist() for r in results] == [[2.0] * 3, [4.0] * 3, [6.0] * 3]


def test_samples_of_different_shapes_are_never_mixed(
    person: LoadedModel, frames: list[Tensor], make_batcher: MakeBatcher
) -> None:
    small = [np.ascontiguousarray(f[:240, :200]) for f in frames]
    batcher, records = make_batcher(person, max_batch_size=4, max_queue_delay_ms=0, start=False)
    futures = [
        batcher.submit(frames[0], "big0"),
        batcher.submit(small[0], "small0"),
        batcher.submit(frames[1], "big1"),
        batcher.submit(small[1], "small1"),
    ]
    batcher.start()
    results = outputs_of(futures)

    assert [r.stream_ids for r in records] == [("big0", "big1"), ("small0", "small1")]
    _assert_close(results[1][2], _direct(person, small[0])[2])


def test_bad_sample_fails_only_its_own_future(
    person: LoadedModel, frames: list[Tensor], make_batcher: MakeBatcher
) -> None:
    batcher, records = make_batcher(person, max_batch_size=4, max_queue_delay_ms=0, start=False)
    bad = batcher.submit(frames[0][:, :, 0], "bad")  # rank 2: the model wants H, W, 3
    good = batcher.submit(frames[0], "good")
    batcher.start()

    with pytest.raises(ModelRunError, match=r"model 'person': .*rank") as caught:
        bad.result(timeout=TIMEOUT_S)
    assert "[ONNXRuntimeError]" not in str(caught.value)
    assert len(good.result(timeout=TIMEOUT_S)) == 4
    assert len(batcher.submit(frames[1]).result(timeout=TIMEOUT_S)) == 4
    assert [(r.stream_ids, r.ok) for r in records[:2]] == [(("bad",), False), (("good",), True)]


def test_cancelled_samples_are_skipped(
    person: LoadedModel, frames: list[Tensor], make_batcher: MakeBatcher
) -> None:
    batcher, records = make_batcher(person, max_batch_size=4, max_queue_delay_ms=0, start=False)
    cancelled = [batcher.submit(frames[0], "dropped"), batcher.submit(frames[1], "dropped")]
    assert all(f.cancel() for f in cancelled)
    batcher.start()  # its first batch is empty
    batcher.submit(frames[1], "kept").result(timeout=TIMEOUT_S)

    assert [r.stream_ids for r in records] == [("kept",)]


def test_stop_fails_waiting_samples_and_joins_the_thread(
    person: LoadedModel, frames: list[Tensor], make_batcher: MakeBatcher
) -> None:
    batcher, records = make_batcher(person, max_batch_size=4, max_queue_delay_ms=1000)
    waiting = [batcher.submit(frames[0]), batcher.submit(frames[1])]

    assert batcher.stop(timeout=TIMEOUT_S)

    for future in waiting:
        with pytest.raises(ModelStoppedError, match="'person'"):
            future.result(timeout=0)
    assert "batch:person" not in {t.name for t in threading.enumerate()}
    with pytest.raises(ModelStoppedError):
        batcher.submit(frames[0]).result(timeout=0)
    assert records == []


def test_submit_refuses_what_is_not_an_array(person: LoadedModel) -> None:
    batcher = ModelBatcher(person, BatchingSpec())
    with pytest.raises(TypeError, match="numpy array"):
        batcher.submit([1, 2, 3])  # type: ignore[arg-type]


def test_a_chooser_picks_each_batchs_session_until_it_is_taken_off(
    person: LoadedModel, frames: list[Tensor], make_batcher: MakeBatcher
) -> None:
    """The seam a profiling window uses: once per batch the chooser picks a session (None:
    the model's own), that session runs the batch and the record says so; without a
    chooser none is asked."""

    class Twin:  # the model's session, counting the runs it is given
        runs = 0

        def run(self, names: list[str], feed: dict[str, Tensor]) -> list[Tensor]:
            self.runs += 1
            return person.session.run(names, feed)  # type: ignore[no-any-return]

    spy = Twin()
    twin = cast(ort.InferenceSession, spy)
    picks = iter([twin, None, twin])
    asked = 0

    class Chooser:
        def session_for_batch(self) -> ort.InferenceSession | None:
            nonlocal asked
            asked += 1
            return next(picks)

    batcher, records = make_batcher(person, max_batch_size=1, max_queue_delay_ms=0)
    batcher.submit(frames[0]).result(timeout=TIMEOUT_S)
    batcher.choose_sessions(Chooser())
    assert batcher.chooser is not None
    for _ in range(3):
        batcher.submit(frames[0]).result(timeout=TIMEOUT_S)
    batcher.choose_sessions(None)
    batcher.submit(frames[0]).result(timeout=TIMEOUT_S)
    assert [r.ort_profiled for r in records] == [False, True, False, True, False]
    assert asked == 3 and spy.runs == 2  # asked once per batch while set; its picks ran
