"""The trace of inline model runs (appliance/models/batcher.py): run on a stream's thread,
their `session.run` stays on the model's own track, with a flow from the stream's wait."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import cv2
import numpy as np

from appliance.config import parse_config
from appliance.models import ModelBatcher, load_model
from appliance.profiling.hooks import trace_batch
from appliance.profiling.tracer import Tracer, Track
from appliance.runtime.runtime import Runtime
from pipelines.spec import BatchingSpec, ModelSpec
from tests.profiling.test_windows import wait_done
from tests.support import tracecheck
from tests.support.appliance import DEMO_CLIP, person_model
from tests.support.models import MODELS, REPO
from tests.tools import perfetto

TIMEOUT_S = 30.0


def person_batcher(tracer: Tracer) -> ModelBatcher:
    cfg = ModelSpec.model_validate(
        {"path": MODELS / "person_ssdlite.onnx", "decoder": "tf_od", "providers": ["cpu"]}
    )
    model = load_model("person", cfg, Path.resolve)
    return ModelBatcher(model, BatchingSpec(), on_batch=lambda r: trace_batch(tracer, r))


def sample() -> np.ndarray[Any, Any]:
    bgr = cv2.imread(str(REPO / "configs" / "media" / "sources" / "astronaut.png"))
    assert bgr is not None
    return np.ascontiguousarray(cv2.resize(bgr, (300, 300))[:, :, ::-1])


def test_an_inline_run_stays_on_the_models_track() -> None:
    """One stream: its first frame's run inline (on its worker), its second through the
    batcher thread; both runs on the `batch:person` track, each with an arrow from the
    stream's wait inside its detect block, the inline one's wait zero-length."""
    tracer = Tracer()
    batcher = person_batcher(tracer)
    batcher.set_producers(1)
    frame = sample()

    def worker() -> None:
        tracer.bind_stream("cam")
        for inline in (True, False):
            batcher.retune(BatchingSpec(inline=inline))
            start = time.perf_counter()
            batcher.submit(frame, "cam").result(TIMEOUT_S)
            tracer.span("people", "block", start, time.perf_counter(), {"stream": "cam"})

    with batcher:
        thread = threading.Thread(target=worker, name="work:cam")
        thread.start()
        thread.join(TIMEOUT_S)
    events = tracer.drain()
    tracecheck.check({"traceEvents": events})

    names = {e["tid"]: e["args"]["name"] for e in events if e["name"] == "thread_name"}
    assert sorted(names.values()) == ["batch:person", "work:cam"]  # one model track
    runs = [e for e in events if e["name"] == "session.run"]
    assert [e["args"].get("inline", False) for e in runs] == [True, False]
    assert {names[e["tid"]] for e in runs} == {"batch:person"}
    waits = [e for e in events if e["name"] == "queue.wait"]
    assert {names[e["tid"]] for e in waits} == {"work:cam"}
    assert waits[0]["dur"] == 0 and waits[0]["ts"] == runs[0]["ts"]
    flows, unbound = perfetto.read_flows(events)
    assert not unbound
    assert [(f.source.name, f.target.name, f.target.ts) for f in flows] == [
        ("queue.wait", "session.run", run["ts"]) for run in runs
    ]


def test_a_virtual_track_is_one_per_name_and_instance() -> None:
    """Two batchers of one model (a reload's successor beside its predecessor) write on
    tracks of their own; one batcher's track is the same from every thread."""
    tracer = Tracer()
    seen: list[Track] = []
    thread = threading.Thread(target=lambda: seen.append(tracer.track("batch:person", 1)))
    thread.start()
    thread.join(TIMEOUT_S)
    first, again, successor = (
        seen[0],
        tracer.track("batch:person", 1),
        tracer.track("batch:person", 2),
    )
    assert first is again and first.tid != successor.tid
    tracer.span("session.run", "model", 1.0, 1.5, {"model": "person"}, track=successor)
    events = tracer.drain()
    names = [(e["tid"], e["args"]["name"]) for e in events if e["name"] == "thread_name"]
    assert names == [(first.tid, "batch:person"), (successor.tid, "batch:person")]
    (run,) = (e for e in events if e["ph"] == "X")
    assert run["tid"] == successor.tid


def test_a_window_places_operators_under_inline_runs(tmp_path: Path) -> None:
    """A profiling window on one stream: its runs are inline, on the profiled twin when
    sampled, and ORT's operators land inside them on the model's track."""
    doc = {
        "profiling": {"dir": "traces", "rotate_s": 600, "max_window_s": 5,
                      "ort_sample_every_n_batches": 1, "ort_max_runs_per_window": 3},
        "models": {"person": person_model()},
        "streams": [
            {"id": "cam", "source": {"url": str(DEMO_CLIP), "pace": "realtime", "loop": True},
             "workflow": {"name": "people",
                          "blocks": [{"id": "people", "type": "detect", "model": "person"}],
                          "outputs": {"people": "people"}}}
        ],
    }  # fmt: skip
    runtime = Runtime(parse_config(doc, tmp_path))
    runtime.start()
    try:
        window = runtime.start_profiling(1.0, ["cam"], ort_operators=True)
        assert wait_done(runtime, window.id).state == "done"
        events = tracecheck.load(runtime.profiling_trace(window.id))["traceEvents"]
    finally:
        runtime.stop()
    tracecheck.check({"traceEvents": events})  # operators nest inside their runs
    names = {e["tid"]: e["args"]["name"] for e in events if e["name"] == "thread_name"}
    sampled = [e for e in events if e["name"] == "session.run" and e["args"].get("ort_profiled")]
    ops = [e for e in events if e.get("cat") == "Node"]
    assert sampled and ops
    # On the model's track, inline or not: a submit that finds the run lock taken (the
    # window swapping the profiled twin in, on a busy machine) queues for the batcher's
    # thread instead of waiting for it. One run a frame on one stream: the rest inline.
    assert all(names[s["tid"]] == "batch:person" for s in sampled)
    assert any(s["args"].get("inline") for s in sampled)
    for op in ops:
        assert any(
            s["tid"] == op["tid"]
            and s["ts"] <= op["ts"] <= op["ts"] + op["dur"] <= s["ts"] + s["dur"]
            for s in sampled
        ), op
