"""Which batches a profiling window runs on the profiled twin (appliance/profiling/
sampling.py): its first, then every Nth, at most max_runs; through a real batcher."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from appliance.models import BatchRecord, LoadedModel, ModelBatcher, load_model
from appliance.profiling.sampling import SampledSessions
from pipelines.spec import BatchingSpec, ModelSpec
from tests.support.models import MODELS

TIMEOUT_S = 30.0  # a future's upper bound on a busy CI machine


@pytest.fixture(scope="module")
def person() -> LoadedModel:
    cfg = ModelSpec.model_validate(
        {"path": MODELS / "person_ssdlite.onnx", "decoder": "tf_od", "providers": ["cpu"]}
    )
    return load_model("person", cfg, Path.resolve)


@pytest.mark.parametrize(
    "every_n, max_runs, picked",
    [
        (4, 2, [0, 4]),  # the third pick (batch 8) is past max_runs
        (3, 100, [0, 3, 6, 9]),
        (1, 3, [0, 1, 2]),
        (0, 2, [0, 1]),  # N below 1 is every batch
        (5, 0, []),
    ],
)
def test_the_first_batch_then_every_nth_up_to_max_runs(
    person: LoadedModel, every_n: int, max_runs: int, picked: list[int]
) -> None:
    sampled = SampledSessions(person.session, every_n, max_runs)
    picks = [sampled.session_for_batch() for _ in range(10)]
    assert [i for i, s in enumerate(picks) if s is not None] == picked
    assert all(s is person.session for s in picks if s is not None)


def test_a_window_samples_its_first_batch_then_every_nth(person: LoadedModel) -> None:
    """However many batches ran before it, a window's first batch is sampled: a window
    shorter than N batches still gets operators. Taken off, no batch is sampled."""
    records: list[BatchRecord] = []
    batching = BatchingSpec(max_batch_size=1, max_queue_delay_ms=0)
    frame = np.zeros((300, 300, 3), np.uint8)
    with ModelBatcher(person, batching, on_batch=records.append) as batcher:
        for _ in range(5):  # the model's batch count is past a multiple of N
            batcher.submit(frame).result(timeout=TIMEOUT_S)
        batcher.choose_sessions(SampledSessions(person.session, every_n=4, max_runs=2))
        for _ in range(10):
            batcher.submit(frame).result(timeout=TIMEOUT_S)
        batcher.choose_sessions(None)
        batcher.submit(frame).result(timeout=TIMEOUT_S)
    sampled = [r.ort_profiled for r in records]
    # Batches 0 and 4 of the window; the third sample (batch 8) is past max_runs.
    window = [True, False, False, False, True, False, False, False, False, False]
    assert sampled == [False] * 5 + window + [False]
