"""Shadows on a running appliance: the person detector on the bundled clip played as a
live camera, the candidate beside it on the same frames (appliance/runtime/shadow.py)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from appliance.config import ConfigError, parse_config
from appliance.errors import (
    NoRollbackError,
    NoShadowError,
    PromotionRefusedError,
    ShadowExistsError,
    UnknownStreamError,
)
from appliance.models import BatchRecord
from appliance.models.pool import ModelConflictError
from appliance.runtime.promotion import PromoteRequest
from appliance.runtime.runtime import Runtime
from appliance.runtime.shadow import ShadowSpec
from pipelines.errors import WorkflowError
from pipelines.types import FrameResult
from tests.support.appliance import DEMO_CLIP, MODELS, detect_workflow, person_model

WAIT_S = 60.0  # two cores shared with the rest of the suite
FRAMES = 12  # compared frame pairs a test waits for


def spec(**fields: Any) -> ShadowSpec:
    """A shadow without a budget (`max_live_cost` 1): whatever the suite's load does to the
    live rate, it samples as asked (tests/shadow/test_budget.py tests the budget)."""
    return ShadowSpec(**{"max_live_cost": 1.0, **fields})


def stream(stream_id: str) -> dict[str, Any]:
    source = {"url": str(DEMO_CLIP), "loop": True, "pace": "realtime"}
    return {"id": stream_id, "source": source, "workflow": detect_workflow()}


@pytest.fixture(scope="module")
def runtime(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Runtime]:
    folder: Path = tmp_path_factory.mktemp("shadow")
    doc = {"models": {"person": person_model()}, "streams": [stream("cam")]}
    rt = Runtime(parse_config(doc, folder))
    rt.start()
    try:
        yield rt
    finally:
        rt.stop()


def compared(rt: Runtime, frames: int = FRAMES, people: int = 5) -> dict[str, Any]:
    """The shadow's report once it compared `frames` frame pairs, on which the live
    workflow found `people` people (the clip's first frames have none)."""
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        report = rt.shadows.find("cam").report()
        comparison = report["comparison"]
        if (
            comparison["frames"] >= frames
            and comparison["matched"] + comparison["missed"] >= people
        ):
            return report
        time.sleep(0.2)
    raise AssertionError(f"{frames} compared frames with {people} people not reached: {report}")


def with_confidence(confidence: float) -> dict[str, Any]:
    workflow = detect_workflow()
    workflow["blocks"][0]["confidence"] = confidence
    return workflow


def test_the_same_workflow_agrees_fully(runtime: Runtime) -> None:
    shared = runtime.models["person"].shared
    before = shared.shared
    runtime.shadows.start("cam", spec(workflow=detect_workflow()))
    try:
        report = compared(runtime)
        comparison = report["comparison"]
        assert comparison["matched"] > 0  # the clip has people: there was something to find
        assert (comparison["agreement"], comparison["missed"], comparison["extra"]) == (1.0, 0, 0)
        assert comparison["examples"] == []
        assert report["ran"] >= FRAMES and report["failed"] == 0
        # Its blocks' own CPU (the watch's clock) and the live streams' mean frame age
        # without it (the budget's baseline period).
        assert comparison["cpu_ms"]["candidate_p50"] is not None
        assert report["budget"]["baseline_age_ms"] > 0
        # Its per-block histograms, beside the live ones: variant="shadow".
        assert (block_count(runtime, "shadow") or 0) >= FRAMES
        assert (block_count(runtime, "live") or 0) > 0
        # One model, the same frame: the second of the two workflows took the first's run.
        assert shared.enabled and shared.shared > before
    finally:
        runtime.shadows.stop("cam")
    assert block_count(runtime, "shadow") is None  # its series went with it
    assert not shared.enabled  # no shadow on the model: nothing kept


def block_count(rt: Runtime, variant: str) -> float | None:
    labels = {"stream": "cam", "block": "people", "type": "detect", "variant": variant}
    return rt.metrics.registry.get_sample_value("appliance_block_latency_seconds_count", labels)


def test_a_stricter_threshold_shows_the_detections_it_drops(runtime: Runtime) -> None:
    # Half the clip's people score under 0.85 (the live workflow keeps 0.4 and up).
    runtime.shadows.start("cam", spec(workflow=with_confidence(0.85)))
    try:
        report = compared(runtime, people=20)["comparison"]
        assert report["missed"] > 0 and report["extra"] == 0
        assert report["agreement"] < 1.0
        for example in report["examples"]:  # each names its frame, box and score
            assert example["kind"] == "missed" and example["output"] == "people"
            assert 0.4 <= example["confidence"] < 0.85
            x1, y1, x2, y2 = example["box"]
            assert 0 <= x1 < x2 and 0 <= y1 < y2 and example["seq"] >= 0
    finally:
        runtime.shadows.stop("cam")


def test_shadow_results_never_reach_the_streams_outputs(runtime: Runtime) -> None:
    candidate = detect_workflow(block="candidate_people")
    seen: list[FrameResult] = []
    lock = threading.Lock()

    def keep(result: FrameResult) -> None:
        with lock:
            seen.append(result)

    unsubscribe = runtime.subscribe(keep, "cam")
    runtime.shadows.start("cam", spec(workflow=candidate))
    try:
        deadline = time.monotonic() + WAIT_S
        while runtime.shadows.find("cam").ran < FRAMES and time.monotonic() < deadline:
            time.sleep(0.2)
        assert runtime.shadows.find("cam").ran >= FRAMES
    finally:
        unsubscribe()
        runtime.shadows.stop("cam")
    with lock:
        assert seen and all(set(r.outputs) == {"people"} for r in seen)
        seqs = [r.seq for r in seen]
    assert seqs == sorted(set(seqs))  # the live results, once each, in order


def test_sampling_every_third_frame(runtime: Runtime) -> None:
    shadow = runtime.shadows.start("cam", spec(workflow=detect_workflow(), every=3))
    try:
        # The budget's first period measures the live rate without the shadow.
        deadline = time.monotonic() + WAIT_S
        while shadow.report()["budget"]["measuring_baseline"]:
            assert time.monotonic() < deadline, "the budget's baseline"
            time.sleep(0.1)
        offered, seen = shadow.offered, runtime.streams["cam"].rate.count
        while runtime.streams["cam"].rate.count < seen + 30:
            assert time.monotonic() < deadline, "30 live frames"
            time.sleep(0.1)
        live = runtime.streams["cam"].rate.count - seen
        # Every third live frame was offered (the first and last may straddle the reads).
        assert abs(shadow.offered - offered - live / 3) <= 2, (shadow.offered - offered, live)
    finally:
        runtime.shadows.stop("cam")
    assert not shadow.report()["running"]


def test_one_shadow_at_a_time_and_clear_errors(runtime: Runtime) -> None:
    runtime.shadows.start("cam", spec(workflow=detect_workflow()))
    try:
        with pytest.raises(ShadowExistsError, match="runs a shadow already"):
            runtime.shadows.start("cam", spec(workflow=detect_workflow()))
    finally:
        final = runtime.shadows.stop("cam")
    assert final.report()["stopped"] is not None
    with pytest.raises(NoShadowError, match="runs no shadow"):
        runtime.shadows.find("cam")
    with pytest.raises(UnknownStreamError):
        runtime.shadows.start("nope", spec(workflow=detect_workflow()))
    broken = {"name": "broken", "blocks": [{"id": "x", "type": "detect", "model": "missing"}],
              "outputs": {"x": "x"}}  # fmt: skip
    with pytest.raises(WorkflowError) as info:
        runtime.shadows.start("cam", spec(workflow=broken))
    assert "stream 'cam' shadow.workflow" in str(info.value) and "missing" in str(info.value)
    with pytest.raises(NoShadowError):  # nothing was left behind
        runtime.shadows.find("cam")


def test_removing_the_stream_ends_its_shadow(tmp_path: Path) -> None:
    doc = {"models": {"person": person_model()}, "streams": [stream("cam")]}
    rt = Runtime(parse_config(doc, tmp_path))
    rt.start()
    try:
        shadow = rt.shadows.start("cam", spec(workflow=detect_workflow()))
        rt.remove_stream("cam")
        assert not shadow.report()["running"] and shadow.stopped is not None
        assert rt.workflows  # the runtime goes on
        with pytest.raises(UnknownStreamError):
            rt.shadows.find("cam")
    finally:
        rt.stop()


def faces_workflow(size: list[int], model_id: str = "faces") -> dict[str, Any]:
    model = {"path": str(MODELS / "centerface.onnx"), "decoder": "centerface",
             "labels": ["face"], "input_size": size, "providers": ["cpu"],
             "session": {"allow_spinning": False}}  # fmt: skip
    return {
        "name": f"faces_{size[0]}",
        "models": {model_id: model},
        "blocks": [{"id": "faces", "type": "detect", "model": model_id, "confidence": 0.4}],
        "outputs": {"faces": "faces"},
    }


def test_a_different_model_reports_its_latency_and_agreement(tmp_path: Path) -> None:
    """CenterFace at half the input size beside it at the demo's: a changed model loads
    beside the live one, and the report has both workflows' latency and the agreement."""
    live = {**stream("cam"), "workflow": faces_workflow([640, 352])}
    rt = Runtime(parse_config({"streams": [live]}, tmp_path))
    rt.start()
    try:
        # The same id declared differently is refused, naming both places...
        with pytest.raises(ModelConflictError, match="already declared differently"):
            rt.shadows.start("cam", spec(workflow=faces_workflow([320, 192])))
        # ...and under an id of its own, the changed model loads beside the live one.
        rt.shadows.start("cam", spec(workflow=faces_workflow([320, 192], "faces_small")))
        report = compared(rt, frames=8, people=3)["comparison"]
        latency = report["latency_ms"]
        low, high = latency.pop("ratio_interval")
        assert all(latency[k] is not None and latency[k] > 0 for k in latency), latency
        assert low <= latency["ratio_p50"] <= high
        assert 0.0 <= report["agreement"] <= 1.0
        assert report["matched"] + report["missed"] >= 3  # the live model found faces
        models = {m.id for m in rt.models_status()}
        assert len(models) == 2, models  # the candidate's model loaded beside the live one
    finally:
        rt.stop()


def test_a_gate_refuses_a_worse_candidate_and_switches_nothing(runtime: Runtime) -> None:
    live = runtime.streams["cam"].workflow.version
    # The shadow's own gates (a config's `promote:`), under a request's.
    strict = PromoteRequest(min_agreement=0.99, max_latency_ratio=100.0, min_frames=5)
    runtime.shadows.start("cam", spec(workflow=with_confidence(0.85), promote=strict))
    try:
        early = PromoteRequest(min_frames=100_000)
        with pytest.raises(PromotionRefusedError, match=r"min_frames: .* the gates need 100000"):
            runtime.shadows.promote("cam", early)
        compared(runtime, people=20)
        with pytest.raises(PromotionRefusedError) as info:
            runtime.shadows.promote("cam", PromoteRequest())
        (refusal,) = info.value.refusals  # the latency gate passed
        assert refusal.startswith("min_agreement: agreement 0.") and "under 0.99" in refusal
        assert runtime.streams["cam"].workflow.version == live
        assert runtime.shadows.find("cam").report()["running"]
    finally:
        runtime.shadows.stop("cam")
    with pytest.raises(NoRollbackError, match="no promotion to roll back"):
        runtime.shadows.rollback("cam")


def test_a_shadow_is_not_waited_for_by_the_batcher(runtime: Runtime) -> None:
    """The shadow's model lease is occasional: the lone live stream's runs stay inline on
    its own thread (a producer the batcher waited for would move them to its thread and
    make each wait out `max_queue_delay_ms`), and so do the shadow's."""
    records: list[BatchRecord] = []
    observed = runtime.profiler.on_batch

    def keep(record: BatchRecord) -> None:
        records.append(record)
        observed(record)

    runtime.profiler.on_batch = keep  # type: ignore[method-assign]
    try:
        runtime.shadows.start("cam", spec(workflow=with_confidence(0.5)))
        compared(runtime, frames=10, people=0)
        runtime.shadows.stop("cam")
    finally:
        runtime.profiler.on_batch = observed  # type: ignore[method-assign]
    assert len(records) >= 20  # the live frames' runs and the shadow's
    # A submit that would wait for the other thread's run queues instead (batcher.py):
    # the shadow submits the same frame as the live worker, so up to half go through the
    # batcher's thread. Counted as a producer, none would run inline (0 of 43 in a run
    # with the shadow's lease counted).
    inline = sum(r.inline for r in records)
    assert inline >= 0.25 * len(records), (inline, len(records))


def test_a_shadow_declared_in_the_config_starts_with_its_stream(tmp_path: Path) -> None:
    live = {**stream("cam"), "shadow": {"workflow": with_confidence(0.85), "max_live_cost": 1}}
    rt = Runtime(parse_config({"models": {"person": person_model()}, "streams": [live]}, tmp_path))
    rt.start()
    try:
        report = compared(rt, frames=5, people=0)
        assert report["every"] == 1 and report["workflow"] == "detect_person"
        rt.restart_stream("cam")  # a restart starts it again with the stream
        assert rt.shadows.find("cam").report()["running"]
    finally:
        rt.stop()


def test_a_declared_shadow_that_does_not_compile_is_named_and_nothing_starts(
    runtime: Runtime,
) -> None:
    broken = {"name": "broken", "blocks": [{"id": "x", "type": "nosuch"}], "outputs": {"x": "x"}}
    added = {**stream("other"), "shadow": {"workflow": broken}}
    with pytest.raises(WorkflowError) as info:
        runtime.add_stream(parse_config({"streams": [added]}, Path(".")).streams[0])
    assert "stream 'other' shadow.workflow" in str(info.value)
    assert "other" not in runtime.streams
    with pytest.raises(ConfigError, match=r"streams\[0\]\.shadow\.every"):
        parse_config(
            {"streams": [{**stream("x"), "shadow": {"workflow": broken, "every": 0}}]}, Path(".")
        )
