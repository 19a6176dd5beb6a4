"""`Runtime.retune` on a real runtime (the bundled clip, the shipped models): batching
changes at once and session options on a session swapped in, both with every stream
untouched; a source setting restarts the streams; the config's `tuning:` applies at start
and on a reload; a model that does not open leaves everything as it was."""

from __future__ import annotations

from concurrent.futures import wait

import numpy as np
import onnxruntime as ort
import pytest

from appliance.config import TuningConfig
from appliance.models import ModelBatcher, ModelLoadError
from appliance.models.batcher import BatchRecord
from appliance.models.tuned import ModelTuning
from appliance.runtime.runtime import Runtime
from appliance.sources.config import SourceTuning
from tests.tune.conftest import (
    DECLARED_BATCH,
    DECLARED_DELAY_MS,
    STREAMS,
    StartRuntime,
    TuneSetup,
    all_processing,
)

FACES_SAMPLE = (3, 192, 320)  # the faces model's input, as the setup declares it


def burst(batcher: ModelBatcher, samples: int) -> list[int]:
    """Submit `samples` at once: the sizes of the batches they ran in, each a list of
    the burst's samples it held (the stream's frames may have shared them)."""
    sizes: list[int] = []
    hook = batcher.on_batch

    def seen(record: BatchRecord) -> None:
        sizes.extend([record.stream_ids.count("burst")] if "burst" in record.stream_ids else [])
        if hook is not None:
            hook(record)

    batcher.on_batch = seen
    try:
        futures = batcher.submit_many([np.zeros(FACES_SAMPLE, np.float32)] * samples, "burst")
        wait(futures, timeout=30)
    finally:
        batcher.on_batch = hook
    assert all(f.exception() is None for f in futures)
    assert sum(sizes) == samples
    return sizes


def spinning(session: ort.InferenceSession) -> str:
    return str(session.get_session_options().get_session_config_entry(
        "session.intra_op.allow_spinning"
    ))  # fmt: skip


def batching(rt: Runtime, model_id: str) -> tuple[int, float]:
    """The model's batching as the pool's spec and its batcher both have it (the same)."""
    spec, _ = rt.pool.specs()[model_id]
    running = rt.pool.handles[model_id].batching
    assert (spec.batching.max_batch_size, spec.batching.max_queue_delay_ms) == (
        running.max_batch_size, running.max_queue_delay_ms,
    )  # fmt: skip
    return spec.batching.max_batch_size, spec.batching.max_queue_delay_ms


def test_batching_changes_live_on_the_same_batcher_session_and_streams(
    tune_setup: TuneSetup, start_runtime: StartRuntime
) -> None:
    rt = start_runtime(tune_setup)
    streams = dict(rt.streams)
    faces = rt.pool.handles["faces"]
    session = faces.model.session
    assert batching(rt, "faces") == (DECLARED_BATCH, DECLARED_DELAY_MS)
    assert max(burst(faces, 8)) == DECLARED_BATCH  # the burst went 4 at a time
    one = TuningConfig(models={"faces": ModelTuning(max_batch_size=1, max_queue_delay_ms=0)})

    done = rt.retune(one)

    assert (done.models, done.restarted) == (["faces"], [])
    assert rt.config.tuning == one
    assert rt.pool.handles["faces"] is faces and faces.model.session is session
    assert batching(rt, "faces") == (1, 0.0)
    assert batching(rt, "person") == (DECLARED_BATCH, DECLARED_DELAY_MS)  # not named
    assert burst(faces, 8) == [1] * 8  # now one sample a batch
    assert {sid: rt.streams[sid] for sid in STREAMS} == streams  # the same objects
    counts = {sid: s.rate.count for sid, s in streams.items()}
    all_processing(rt)
    assert all(streams[sid].rate.count > counts[sid] for sid in STREAMS)


def test_session_options_swap_the_session_without_a_restart(
    tune_setup: TuneSetup, start_runtime: StartRuntime
) -> None:
    rt = start_runtime(tune_setup)
    streams = dict(rt.streams)
    faces = rt.pool.handles["faces"]
    first = faces.model.session
    quiet = TuningConfig(models={"faces": ModelTuning(allow_spinning=False, intra_op_threads=2)})

    done = rt.retune(quiet)

    assert (done.models, done.restarted) == (["faces"], [])
    assert rt.pool.handles["faces"] is faces  # the same batcher, its queue and leases
    session = faces.model.session
    assert session is not first
    assert session.get_session_options().intra_op_num_threads == 2
    assert spinning(session) == "0" and spinning(first) == "1"
    spec, _ = rt.pool.specs()["faces"]
    assert (spec.session.allow_spinning, spec.session.intra_op_threads) == (False, 2)
    assert rt.pool.session_spec("faces") == spec.session
    assert batching(rt, "faces") == (DECLARED_BATCH, DECLARED_DELAY_MS)
    assert {sid: rt.streams[sid] for sid in STREAMS} == streams
    served = faces.batches
    all_processing(rt)
    assert faces.batches > served  # the stream's frames run on the new session
    assert sum(burst(faces, 4)) == 4  # a burst runs on it too


def test_a_source_setting_restarts_the_streams_and_no_tuning_restores_the_declared(
    tune_setup: TuneSetup, start_runtime: StartRuntime
) -> None:
    rt = start_runtime(tune_setup)
    streams = dict(rt.streams)
    faces = rt.pool.handles["faces"]
    tuning = TuningConfig(
        models={"faces": ModelTuning(max_batch_size=1, allow_spinning=False)},
        sources=SourceTuning(decoder_threads=1),
    )

    done = rt.retune(tuning)

    assert done.models == ["faces"] and sorted(done.restarted) == sorted(STREAMS)
    restarted = dict(rt.streams)
    assert all(restarted[sid] is not streams[sid] for sid in STREAMS)
    assert all(s.cfg.source.decoder_threads == 1 for s in restarted.values())
    assert all(c.source.decoder_threads == 0 for c in rt.streams.declared.values())
    assert rt.pool.handles["faces"] is faces  # the models were not reloaded
    all_processing(rt)

    # Back to no tuning: the declared settings, the streams restarted once more.
    done = rt.retune(TuningConfig())

    assert done.models == ["faces"] and sorted(done.restarted) == sorted(STREAMS)
    assert rt.config.tuning == TuningConfig()
    assert batching(rt, "faces") == (DECLARED_BATCH, DECLARED_DELAY_MS)
    spec, _ = rt.pool.specs()["faces"]
    assert (spec.session.allow_spinning, spec.session.intra_op_threads) == (True, 1)
    assert spinning(faces.model.session) == "1"
    assert all(s.cfg.source.decoder_threads == 0 for s in rt.streams.values())
    assert all(rt.streams[sid] is not restarted[sid] for sid in STREAMS)
    assert max(burst(faces, 8)) == DECLARED_BATCH
    all_processing(rt)
    # Retuned to what runs already: nothing changes, nothing restarts.
    done = rt.retune(TuningConfig())
    assert (done.models, done.restarted) == ([], [])


def test_the_config_tuning_applies_at_start_to_a_workflow_model(
    tune_setup: TuneSetup, start_runtime: StartRuntime
) -> None:
    tuning = {"models": {"faces": {"max_batch_size": 2, "allow_spinning": False}},
              "sources": {"decoder_threads": 1}}  # fmt: skip
    tune_setup.write(tuning)

    rt = start_runtime(tune_setup)

    assert rt.config.tuning == TuningConfig.model_validate(tuning)
    spec, fixed = rt.pool.specs()["faces"]  # declared in blur.yaml, not in the config
    assert fixed is None
    assert spec.batching.max_batch_size == 2 and spec.session.allow_spinning is False
    assert spec.session.intra_op_threads == 1  # the workflow's own, not tuned
    assert batching(rt, "faces") == (2, DECLARED_DELAY_MS)
    assert spinning(rt.pool.handles["faces"].model.session) == "0"
    assert rt.pool.specs()["person"][0].session.allow_spinning is True
    assert all(s.cfg.source.decoder_threads == 1 for s in rt.streams.values())
    assert all(c.source.decoder_threads == 0 for c in rt.streams.declared.values())


def test_a_reload_with_a_changed_tuning_section_applies_it_live(
    tune_setup: TuneSetup, start_runtime: StartRuntime
) -> None:
    rt = start_runtime(tune_setup)
    streams = dict(rt.streams)
    faces, person = rt.pool.handles["faces"], rt.pool.handles["person"]
    session = faces.model.session
    tuning = {"models": {"faces": {"allow_spinning": False},
                         "person": {"max_batch_size": 1, "max_queue_delay_ms": 0}}}  # fmt: skip
    tune_setup.write(tuning)

    plan = rt.reload()

    assert not any(v for k, v in plan.summary().items() if k != "unchanged")
    assert rt.config.tuning == TuningConfig.model_validate(tuning)
    assert rt.pool.handles["faces"] is faces and rt.pool.handles["person"] is person
    assert faces.model.session is not session and spinning(faces.model.session) == "0"
    assert batching(rt, "person") == (1, 0.0)
    assert batching(rt, "faces") == (DECLARED_BATCH, DECLARED_DELAY_MS)
    assert {sid: rt.streams[sid] for sid in STREAMS} == streams
    all_processing(rt)

    tune_setup.write(None)  # the section gone: back to the declared settings, live
    rt.reload()

    assert rt.config.tuning == TuningConfig()
    assert batching(rt, "person") == (DECLARED_BATCH, DECLARED_DELAY_MS)
    assert spinning(faces.model.session) == "1"
    assert {sid: rt.streams[sid] for sid in STREAMS} == streams
    all_processing(rt)


def test_a_session_that_does_not_open_leaves_every_model_as_it_was(
    tune_setup: TuneSetup, start_runtime: StartRuntime
) -> None:
    rt = start_runtime(tune_setup)
    streams = dict(rt.streams)
    specs = rt.pool.specs()
    running = {m: rt.pool.handles[m].batching for m in ("faces", "person")}
    faces_session = rt.pool.handles["faces"].model.session
    tune_setup.break_model("faces")
    # `person` (loaded first, from the config) changes before `faces` fails to open.
    candidate = TuningConfig(models={
        "person": ModelTuning(max_batch_size=1, allow_spinning=False),
        "faces": ModelTuning(max_batch_size=1, allow_spinning=False),
    })  # fmt: skip

    with pytest.raises(ModelLoadError, match="faces") as failed:
        rt.retune(candidate)

    assert "not a valid ONNX model" in str(failed.value)
    assert rt.config.tuning == TuningConfig()
    assert rt.pool.specs() == specs
    assert {m: rt.pool.handles[m].batching for m in running} == running
    assert rt.pool.handles["faces"].model.session is faces_session
    assert spinning(rt.pool.handles["person"].model.session) == "1"
    assert {sid: rt.streams[sid] for sid in STREAMS} == streams
    all_processing(rt)
    # A batching change alone opens nothing: it still applies.
    assert rt.retune(TuningConfig(models={"faces": ModelTuning(max_batch_size=2)})).models == [
        "faces"
    ]
    assert batching(rt, "faces") == (2, DECLARED_DELAY_MS)
