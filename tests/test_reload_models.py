"""A reload with a model's settings changed (a workflow file's own model, or the config's
`models:`): the new definition loads beside the old one, the restarted streams run on it,
the old batcher serves whatever still leases it and stops when that ends; a dry run or a
failed reload leaves the old one current and running."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml

from appliance.config import StreamConfig, load_config
from appliance.models import ModelBatcher, ModelLoadError, ModelStoppedError
from appliance.models.pool import ModelConflictError
from appliance.runtime.runtime import Runtime
from tests.support.appliance import MODELS, ROOT, detect_workflow, person_model
from tests.support.media import MakeClip

WAIT_S = 30.0
BLUR = ROOT / "configs" / "workflows" / "privacy_blur.yaml"  # declares its own `faces`


class Setup:
    """A config on disk running `faces-cam` on a copy of privacy_blur.yaml (its `faces`
    model on the CPU, small), and `people-cam` on the config's `person` model."""

    def __init__(self, folder: Path, clip: Path) -> None:
        self.folder = folder
        self.clip = clip
        self.workflow = folder / "blur.yaml"
        self.config = folder / "config.yaml"
        doc = yaml.safe_load(BLUR.read_text(encoding="utf-8"))
        faces = doc["models"]["faces"]
        faces.update(path=str(MODELS / "centerface.onnx"), providers=["cpu"], input_size=[320, 192])
        faces["session"] = {"intra_op_threads": 1}
        self.write_workflow(doc)
        self.write_config(self.config_doc())

    def stream(self, stream_id: str, workflow: Any) -> dict[str, Any]:
        source = {"url": str(self.clip), "loop": True, "pace": "realtime"}
        return {"id": stream_id, "source": source, "workflow": workflow}

    def config_doc(self) -> dict[str, Any]:
        return {
            "models": {"person": person_model()},
            "streams": [
                self.stream("faces-cam", "blur.yaml"),
                self.stream("people-cam", detect_workflow()),
            ],
        }

    def write_config(self, doc: dict[str, Any]) -> None:
        self.config.write_text(yaml.safe_dump(doc), encoding="utf-8")

    def workflow_doc(self) -> dict[str, Any]:
        return dict(yaml.safe_load(self.workflow.read_text(encoding="utf-8")))

    def write_workflow(self, doc: dict[str, Any], path: Path | None = None) -> None:
        (path or self.workflow).write_text(yaml.safe_dump(doc), encoding="utf-8")

    def edit_faces(self, **changes: Any) -> None:
        doc = self.workflow_doc()
        doc["models"]["faces"].update(changes)
        self.write_workflow(doc)


@pytest.fixture
def setup(tmp_path: Path, make_clip: MakeClip) -> Setup:
    return Setup(tmp_path, make_clip(320, 240, fps=15, seconds=2.0))


@pytest.fixture
def runtime(setup: Setup) -> Iterator[Runtime]:
    rt = Runtime(load_config(setup.config), config_path=setup.config)
    rt.start()
    try:
        for sid in rt.streams:
            processing(rt, sid)
        yield rt
    finally:
        rt.stop()


def wait_for(check: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def processing(rt: Runtime, sid: str) -> None:
    """The stream (as it is now) processes frames on, after whatever it did so far."""
    stream = rt.streams[sid]
    count = stream.rate.count
    wait_for(lambda: stream.rate.count > count, f"{sid} processing")


def serving(batcher: ModelBatcher) -> None:
    """The batcher runs batches on, from whatever leases it."""
    batches = batcher.batches
    wait_for(lambda: batcher.batches > batches, f"{batcher.info.id} batches")


def stopped(batcher: ModelBatcher) -> bool:
    """The batcher refuses work: it was stopped (its thread asked to end)."""
    sample = np.zeros((3, 192, 320), np.float32)
    error = batcher.submit(sample).exception(timeout=WAIT_S)
    return isinstance(error, ModelStoppedError)


def batch_threads(model_id: str) -> int:
    return sum(1 for t in threading.enumerate() if t.name == f"batch:{model_id}")


def inferences(rt: Runtime, model_id: str) -> float | None:
    """The model's exported batch count (None: its series were removed)."""
    name = "appliance_model_inference_seconds_count"
    return rt.metrics.registry.get_sample_value(name, {"model": model_id})


def test_an_edited_workflow_model_is_loaded_anew_and_the_stream_runs_on_it(
    runtime: Runtime, setup: Setup
) -> None:
    rt = runtime
    old = rt.pool.handles["faces"]
    assert old.info.input_size == (320, 192)
    setup.edit_faces(input_size=[256, 160], session={"intra_op_threads": 2})

    plan = rt.reload()

    assert plan.summary()["restarted"] == ["faces-cam"]
    new = rt.pool.handles["faces"]
    assert new is not old
    assert new.info.input_size == (256, 160)
    assert rt.pool.session_spec("faces").intra_op_threads == 2
    processing(rt, "faces-cam")
    serving(new)
    # The old batcher ended with its last lease (the old stream, removed by the reload).
    assert stopped(old)
    wait_for(lambda: batch_threads("faces") == 1, "one batch:faces thread")
    [status] = [m for m in rt.models_status() if m.id == "faces"]
    assert status.users == 1
    # Its release left the successor's series (they are labelled by id only) exported.
    before = inferences(rt, "faces")
    assert before is not None
    serving(new)
    after = inferences(rt, "faces")
    assert after is not None and after > before


def test_a_stream_still_on_the_old_model_keeps_it_until_it_is_removed(
    runtime: Runtime, setup: Setup
) -> None:
    rt = runtime
    rt.add_stream(StreamConfig.model_validate(setup.stream("api-cam", setup.workflow)))
    processing(rt, "api-cam")
    old = rt.pool.handles["faces"]
    setup.edit_faces(input_size=[256, 160])

    rt.reload()  # api-cam is not in the file: left alone, on the old model

    new = rt.pool.handles["faces"]
    assert new is not old
    serving(old)
    serving(new)
    assert batch_threads("faces") == 2
    # A compile now gets the new model, though the old one's compilation is cached.
    rt.add_stream(StreamConfig.model_validate(setup.stream("late-cam", setup.workflow)))
    processing(rt, "late-cam")
    [status] = [m for m in rt.models_status() if m.id == "faces"]
    assert status.users == 2  # faces-cam and late-cam
    rt.remove_stream("api-cam")  # its lease was on the old batcher: the last one
    assert stopped(old)
    [status] = [m for m in rt.models_status() if m.id == "faces"]
    assert status.users == 2
    serving(new)
    assert inferences(rt, "faces") is not None


def test_a_dry_run_and_a_failed_reload_leave_the_old_model_running(
    runtime: Runtime, setup: Setup
) -> None:
    rt = runtime
    old = rt.pool.handles["faces"]
    stream = rt.streams["faces-cam"]
    setup.edit_faces(input_size=[256, 160])

    plan = rt.reload(dry_run=True)

    assert plan.summary()["restarted"] == ["faces-cam"]
    assert rt.pool.handles["faces"] is old
    assert rt.pool.handles["faces"].info.input_size == (320, 192)
    assert rt.streams["faces-cam"] is stream
    wait_for(lambda: batch_threads("faces") == 1, "the dry run's model stopped")
    serving(old)

    doc = setup.config_doc()  # and a stream whose workflow does not compile
    broken = {"name": "broken", "blocks": [{"id": "x", "type": "annotate"}],
              "outputs": {"video": "ghost"}}  # fmt: skip
    doc["streams"].append(setup.stream("broken-cam", broken))
    setup.write_config(doc)
    with pytest.raises(Exception, match="unknown block 'ghost'"):
        rt.reload()

    assert rt.pool.handles["faces"] is old
    assert rt.pool.session_spec("faces").intra_op_threads == 1
    assert rt.streams["faces-cam"] is stream
    wait_for(lambda: batch_threads("faces") == 1, "the failed reload's model stopped")
    serving(old)
    assert inferences(rt, "faces") is not None

    setup.write_config(setup.config_doc())  # fixed: the same change now applies
    rt.reload()
    assert rt.pool.handles["faces"].info.input_size == (256, 160)
    assert stopped(old)
    processing(rt, "faces-cam")


def test_a_changed_config_model_restarts_the_streams_that_run_it(
    runtime: Runtime, setup: Setup
) -> None:
    rt = runtime
    old = rt.pool.handles["person"]
    people, faces = rt.streams["people-cam"], rt.streams["faces-cam"]
    doc = setup.config_doc()
    doc["models"]["person"]["session"] = {"intra_op_threads": 2}
    setup.write_config(doc)

    plan = rt.reload()

    assert plan.summary()["restarted"] == ["people-cam"]
    new = rt.pool.handles["person"]
    assert new is not old
    assert rt.pool.session_spec("person").intra_op_threads == 2
    assert rt.streams["people-cam"] is not people
    assert rt.streams["faces-cam"] is faces
    processing(rt, "people-cam")
    serving(new)
    assert stopped(old)
    wait_for(lambda: batch_threads("person") == 1, "one batch:person thread")
    [status] = [m for m in rt.models_status() if m.id == "person"]
    assert status.pinned
    assert inferences(rt, "person") is not None


def test_a_changed_config_model_that_does_not_load_replaces_nothing(
    runtime: Runtime, setup: Setup
) -> None:
    rt = runtime
    old = rt.pool.handles["person"]
    people = rt.streams["people-cam"]
    doc = setup.config_doc()
    broken = setup.folder / "broken.onnx"  # passes the file checks, fails to load
    broken.write_bytes(b"not an ONNX model")
    doc["models"]["person"]["path"] = str(broken)
    setup.write_config(doc)

    with pytest.raises(ModelLoadError, match=r"models\.person: "):
        rt.reload()

    assert rt.pool.handles["person"] is old
    assert rt.streams["people-cam"] is people
    assert batch_threads("person") == 1
    serving(old)


def test_another_place_declaring_the_model_differently_is_still_a_conflict(
    runtime: Runtime, setup: Setup
) -> None:
    rt = runtime
    old = rt.pool.handles["faces"]
    other = setup.folder / "other.yaml"
    doc = setup.workflow_doc()
    doc["models"]["faces"]["input_size"] = [256, 160]
    setup.write_workflow(doc, other)
    config = setup.config_doc()
    config["streams"].append(setup.stream("other-cam", "other.yaml"))
    setup.write_config(config)

    with pytest.raises(ModelConflictError) as caught:
        rt.reload()

    message = str(caught.value)  # both files named as the config names them
    assert f"({other.name}) models.faces" in message
    assert f"({setup.workflow.name}) models.faces" in message
    assert rt.pool.handles["faces"] is old
    assert "other-cam" not in rt.streams
    serving(old)


def test_a_dry_run_keeps_a_changed_model_that_nothing_leases(
    runtime: Runtime, setup: Setup
) -> None:
    rt = runtime
    doc = setup.config_doc()
    doc["models"]["spare"] = person_model()  # pinned, run by no stream
    setup.write_config(doc)
    rt.reload()
    old = rt.pool.handles["spare"]
    doc["models"]["spare"] = person_model(max_batch_size=8)
    setup.write_config(doc)

    plan = rt.reload(dry_run=True)

    assert plan.summary()["restarted"] == []
    assert rt.pool.handles["spare"] is old
    assert not stopped(old)
    assert batch_threads("spare") == 1

    rt.reload()

    new = rt.pool.handles["spare"]
    assert new is not old and new.batching.max_batch_size == 8
    assert stopped(old)
    assert batch_threads("spare") == 1
    [status] = [m for m in rt.models_status() if m.id == "spare"]
    assert status.pinned
