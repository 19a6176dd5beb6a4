"""Inline runs of ModelBatcher (`batching.inline`), with real models and ONNX Runtime: a
sample nothing can batch with runs on its caller's thread, with the batcher thread's
semantics (chooser, padding, records, failures, stop), and queues whenever it could
overtake a sample or would wait for a run."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future
from pathlib import Path
from typing import Any, cast

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

Run = tuple[BatchRecord, str]  # a record and the name of the thread that ran it
MakeBatcher = Callable[..., tuple[ModelBatcher, list[Run]]]


@pytest.fixture
def make_batcher() -> Iterator[MakeBatcher]:
    """Started batchers whose records say which thread ran each batch; stopped after."""
    made: list[ModelBatcher] = []

    def make(
        model: LoadedModel, producers: int, inline: bool = True, start: bool = True, **batching: Any
    ) -> tuple[ModelBatcher, list[Run]]:
        runs: list[Run] = []
        spec = BatchingSpec(inline=inline, **batching)
        batcher = ModelBatcher(
            model, spec, on_batch=lambda r: runs.append((r, threading.current_thread().name))
        )
        made.append(batcher)
        batcher.set_producers(producers)
        if start:
            batcher.start()
        return batcher, runs

    yield make
    for batcher in made:
        batcher.stop()


def _in_thread(target: Callable[[], Any], name: str) -> None:
    thread = threading.Thread(target=target, name=name)
    thread.start()
    thread.join(TIMEOUT_S)
    assert not thread.is_alive()


def test_one_producer_runs_on_its_own_thread(
    person: LoadedModel, frames: list[Tensor], make_batcher: MakeBatcher
) -> None:
    batcher, runs = make_batcher(person, producers=1, max_batch_size=4, max_queue_delay_ms=1000)
    futures: list[Future[Sequence[Tensor]]] = []
    _in_thread(lambda: futures.append(batcher.submit(frames[0], "cam")), "work:cam")

    assert futures[0].done()  # completed before submit returned: no hand-off
    assert [(r.inline, r.stream_ids, r.queue_wait_s, name) for r, name in runs] == [
        (True, ("cam",), (0.0,), "work:cam")
    ]
    assert runs[0][0].batcher == batcher.serial and runs[0][0].ok
    assert (batcher.batches, batcher.samples) == (1, 1)


def test_batches_of_one_run_inline_for_every_stream(
    person: LoadedModel, frames: list[Tensor], make_batcher: MakeBatcher
) -> None:
    batcher, runs = make_batcher(person, producers=3, max_batch_size=1, max_queue_delay_ms=0)
    for stream in ("a", "b"):

        def work(stream: str = stream) -> None:
            batcher.submit(frames[0], stream).result(0)  # done when submit returns

        _in_thread(work, f"work:{stream}")

    assert [(r.stream_ids, r.inline, name) for r, name in runs] == [
        (("a",), True, "work:a"),
        (("b",), True, "work:b"),
    ]


def test_two_producers_batch_together_on_the_batcher_thread(
    person: LoadedModel, frames: list[Tensor], make_batcher: MakeBatcher
) -> None:
    batcher, runs = make_batcher(person, producers=2, max_batch_size=4, max_queue_delay_ms=1000)
    futures = [batcher.submit(frames[0], "a"), batcher.submit(frames[1], "b")]
    outputs_of(futures)

    assert [(r.stream_ids, r.inline, name) for r, name in runs] == [
        (("a", "b"), False, "batch:person")
    ]


def test_inline_outputs_equal_the_batcher_threads(
    person: LoadedModel, frames: list[Tensor], make_batcher: MakeBatcher
) -> None:
    inline, inline_runs = make_batcher(person, producers=1, max_batch_size=4)
    queued, queued_runs = make_batcher(person, producers=1, inline=False, max_batch_size=4)
    for frame in frames:
        got = inline.submit(frame, "cam").result(0)
        want = queued.submit(frame, "cam").result(TIMEOUT_S)
        assert len(got) == len(want) == 4
        for g, w in zip(got, want, strict=True):
            assert g.shape == w.shape and np.array_equal(g, w)
    assert {r.inline for r, _ in inline_runs} == {True}
    assert {(r.inline, name) for r, name in queued_runs} == {(False, "batch:person")}


def test_retune_turns_inline_off_and_on(
    person: LoadedModel, frames: list[Tensor], make_batcher: MakeBatcher
) -> None:
    batcher, runs = make_batcher(person, producers=1, inline=False, max_batch_size=4)
    batcher.submit(frames[0], "cam").result(TIMEOUT_S)
    batcher.retune(BatchingSpec(max_batch_size=4, inline=True))
    batcher.submit(frames[0], "cam").result(0)
    batcher.retune(BatchingSpec(max_batch_size=4, inline=False))
    batcher.submit(frames[0], "cam").result(TIMEOUT_S)
    batcher.set_producers(2)  # a second stream came: nothing runs inline any more
    batcher.retune(BatchingSpec(max_batch_size=4, max_queue_delay_ms=0, inline=True))
    batcher.submit(frames[0], "cam").result(TIMEOUT_S)

    me = threading.current_thread().name
    assert [(r.inline, name) for r, name in runs] == [
        (False, "batch:person"),
        (True, me),
        (False, "batch:person"),
        (False, "batch:person"),
    ]


def test_the_chooser_picks_an_inline_runs_session(
    person: LoadedModel, frames: list[Tensor], make_batcher: MakeBatcher
) -> None:
    class Twin:  # the model's session, counting the runs it is given
        runs = 0

        def run(self, names: list[str], feed: dict[str, Tensor]) -> list[Tensor]:
            self.runs += 1
            return person.session.run(names, feed)  # type: ignore[no-any-return]

    spy = Twin()
    picks = iter([cast(ort.InferenceSession, spy), None])

    class Chooser:
        def session_for_batch(self) -> ort.InferenceSession | None:
            return next(picks)

    batcher, runs = make_batcher(person, producers=1)
    batcher.choose_sessions(Chooser())
    batcher.submit(frames[0], "cam").result(0)
    batcher.submit(frames[0], "cam").result(0)

    assert [(r.inline, r.ort_profiled) for r, _ in runs] == [(True, True), (True, False)]
    assert spy.runs == 1


def test_a_failed_inline_run_fails_only_its_futures(
    person: LoadedModel, frames: list[Tensor], make_batcher: MakeBatcher
) -> None:
    batcher, runs = make_batcher(person, producers=1)
    bad = batcher.submit(frames[0][:, :, 0], "cam")  # rank 2: the model wants H, W, 3

    with pytest.raises(ModelRunError, match=r"model 'person': .*rank"):
        bad.result(0)
    assert len(batcher.submit(frames[0], "cam").result(0)) == 4
    assert [(r.inline, r.ok) for r, _ in runs] == [(True, False), (True, True)]


def test_stop_refuses_submits_that_would_run_inline(
    person: LoadedModel, frames: list[Tensor], make_batcher: MakeBatcher
) -> None:
    batcher, runs = make_batcher(person, producers=1)
    batcher.submit(frames[0], "cam").result(0)
    assert batcher.stop(TIMEOUT_S)
    batcher.set_producers(1)  # a late lease changes nothing: stopped is stopped

    with pytest.raises(ModelStoppedError, match="'person'"):
        batcher.submit(frames[0], "cam").result(0)
    assert len(runs) == 1 and (batcher.batches, batcher.samples) == (1, 1)


def test_a_frames_crops_run_inline_in_batches(
    person: LoadedModel, frames: list[Tensor], make_batcher: MakeBatcher
) -> None:
    batcher, runs = make_batcher(person, producers=1, max_batch_size=2)
    small = np.ascontiguousarray(frames[0][:240, :200])
    crops = [frames[0], frames[1], frames[2], small]
    results = [f.result(0) for f in batcher.submit_many(crops, "cam")]

    # max_batch_size 2, and never two shapes in one run: [0, 1], [2], [small].
    assert [(r.batch_size, r.inline) for r, _ in runs] == [(2, True), (1, True), (1, True)]
    for crop, result in zip(crops, results, strict=True):
        want = person.session.run(person.output_names, {person.input_name: crop[None]})
        for got, expected in zip(result, want, strict=True):
            np.testing.assert_allclose(got.astype(np.float64), expected[0], atol=1e-4)
    assert (batcher.batches, batcher.samples) == (3, 4)


def test_a_fixed_batch_is_padded_inline(
    doubling_model_path: Path, make_batcher: MakeBatcher
) -> None:
    double = load_cpu("double", doubling_model_path)  # y = x + x, batch fixed at 2
    batcher, runs = make_batcher(double, producers=1, max_batch_size=4)
    samples = [np.full(3, i, dtype=np.float32) for i in (1, 2, 3)]
    results = [f.result(0) for f in batcher.submit_many(samples, "cam")]

    assert [(r.batch_size, r.inline) for r, _ in runs] == [(2, True), (1, True)]  # 3 + pad
    assert [r[0].tolist() for r in results] == [[2.0] * 3, [4.0] * 3, [6.0] * 3]


def test_a_busy_model_queues_and_keeps_a_streams_order(
    person: LoadedModel, frames: list[Tensor], make_batcher: MakeBatcher
) -> None:
    """While a run holds the model, a submit queues (never waits for it); and once a
    stream has a sample queued, its next one queues behind it instead of running inline
    ahead of it. The batcher thread starts last, so the queue is seen, not raced."""
    entered, release = threading.Event(), threading.Event()

    class Holding:  # holds the first run, inside the run lock, until released
        first = True

        def session_for_batch(self) -> ort.InferenceSession | None:
            if self.first:
                self.first = False
                entered.set()
                assert release.wait(TIMEOUT_S)
            return None

    batcher, runs = make_batcher(person, producers=1, max_batch_size=1, start=False)
    batcher.choose_sessions(Holding())
    holder = threading.Thread(target=lambda: batcher.submit(frames[0], "other"), name="work:o")
    holder.start()
    assert entered.wait(TIMEOUT_S)
    first = batcher.submit(frames[1], "cam")  # the model is busy: queued at once
    assert not first.done()
    release.set()
    holder.join(TIMEOUT_S)
    second = batcher.submit(frames[2], "cam")  # the model is free, but `first` waits
    assert not second.done()
    batcher.start()
    outputs_of([first, second])

    assert [(r.stream_ids, r.inline, name) for r, name in runs] == [
        (("other",), True, "work:o"),
        (("cam",), False, "batch:person"),
        (("cam",), False, "batch:person"),
    ]
    assert runs[1][0].run_start < runs[2][0].run_start  # in submit order
