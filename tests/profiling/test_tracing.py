"""Continuous tracing through the real runtime: rolling files that pass a strict format
check, spans that match what was processed, write failures that stop nothing."""

from __future__ import annotations

import asyncio
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np

from appliance.config import parse_config
from appliance.models.batcher import BatchRecord
from appliance.profiling.hooks import StreamTrace, trace_batch
from appliance.profiling.rolling import RollingWriter
from appliance.profiling.tracer import Tracer
from appliance.runtime.runtime import Runtime
from appliance.tools.fingerprint import fingerprint_file
from pipelines.types import FrameResult
from tests.support import tracecheck
from tests.support.appliance import DEMO_CLIP, MODELS, person_model
from tests.tools import perfetto

FRAMES = 30


def config(tmp_path: Path, profiling: dict[str, Any], frames_from: Path = DEMO_CLIP) -> Any:
    doc = {
        "profiling": profiling,
        "models": {"person": person_model()},
        "streams": [
            {
                "id": "cam",
                "source": {"url": str(frames_from), "pace": "fast"},
                "draw": "always",  # every block in the trace, drawing too
                "workflow": {
                    "name": "people",
                    "blocks": [
                        {"id": "people", "type": "detect", "model": "person"},
                        {"id": "drawn", "type": "annotate", "detections": "people"},
                    ],
                    "outputs": {"video": "drawn", "people": "people"},
                },
            }
        ],
    }
    return parse_config(doc, tmp_path)


def run(tmp_path: Path, profiling: dict[str, Any]) -> Runtime:
    rt = Runtime(config(tmp_path, profiling), max_frames=FRAMES)
    rt.start()
    try:
        assert rt.wait_done(timeout=60)
    finally:
        assert rt.stop()
    return rt


def test_a_run_leaves_one_valid_rolling_trace_matching_the_work(tmp_path: Path) -> None:
    rt = run(tmp_path, {"dir": "traces", "rotate_s": 600})
    files = list((tmp_path / "traces" / "rolling").glob("trace-*.json"))
    assert len(files) == 1  # written at shutdown: nothing lost
    doc = tracecheck.load(files[0])
    tracecheck.check(doc)
    events = [e for e in doc["traceEvents"] if e["ph"] == "X"]
    runs = [e for e in events if e["name"] == "workflow.run"]
    assert len(runs) == FRAMES == rt.streams["cam"].rate.count
    assert sorted(e["args"]["seq"] for e in runs) == list(range(FRAMES))
    for block in ("people", "drawn"):
        assert sum(e["name"] == block and e["cat"] == "block" for e in events) == FRAMES
    batches = [e for e in events if e["name"] == "session.run"]
    assert sum(e["args"]["batch_size"] for e in batches) == FRAMES
    assert all(e["args"]["model"] == "person" and e["args"]["streams"] for e in batches)
    # Each wait for the model sits inside a detect block on the worker's own track.
    detects = [e for e in events if e["name"] == "people"]
    waits = [e for e in events if e["name"] == "queue.wait"]
    assert len(waits) == FRAMES
    for w in waits:
        assert any(
            d["tid"] == w["tid"] and d["ts"] <= w["ts"] and w["ts"] + w["dur"] <= d["ts"] + d["dur"]
            for d in detects
        ), w
    names = {e["args"]["name"] for e in doc["traceEvents"] if e["name"] == "thread_name"}
    assert {"work:cam", "grab:cam", "batch:person"} <= names
    # One stream: every run inline, on the worker's thread, yet on the model's own track
    # (one, named like its batcher thread), apart from the waits on the worker's track.
    tracks = {e["tid"]: e["args"]["name"] for e in doc["traceEvents"] if e["name"] == "thread_name"}
    assert all(e["args"].get("inline") for e in batches)
    assert {tracks[e["tid"]] for e in batches} == {"batch:person"}
    assert {tracks[w["tid"]] for w in waits} == {"work:cam"}
    assert list(tracks.values()).count("batch:person") == 1
    # Every frame was read and decoded on the grabber's track, and a flow links it to the
    # workflow run that processed it, on another thread (read as Perfetto reads it).
    grabs = {e["args"]["seq"]: e for e in events if e["name"] == "grab"}
    assert set(range(FRAMES)) <= set(grabs)
    flows, unbound = perfetto.read_flows(doc["traceEvents"])
    assert not unbound
    into_runs = {f.target.args["seq"]: f for f in flows if f.target.name == "workflow.run"}
    assert set(into_runs) == set(range(FRAMES))
    for seq, flow in into_runs.items():
        assert flow.source.name == "grab" and flow.source.args["seq"] == seq
        assert flow.source.tid == grabs[seq]["tid"] != flow.target.tid
    # The histograms counted the same frames the trace shows.
    count = rt.metrics.registry.get_sample_value(
        "appliance_block_latency_seconds_count",
        {"stream": "cam", "block": "people", "type": "detect", "variant": "live"},
    )
    assert count == FRAMES
    assert rt.metrics.registry.get_sample_value("appliance_trace_files_written_total") == 1
    # `trace summarize` on this real trace names the real hot spot: the detector.
    blocks = fingerprint_file(files[0])["blocks"]
    assert next(iter(blocks)) == "cam/people"  # the hottest first
    assert blocks["cam/people"]["count"] == blocks["cam/drawn"]["count"] == FRAMES


def test_an_unwritable_trace_dir_stops_nothing(tmp_path: Path) -> None:
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("a file where the trace folder should be")
    rt = run(tmp_path, {"dir": str(blocker), "rotate_s": 600})
    assert rt.streams["cam"].rate.count == FRAMES  # every frame processed all the same
    assert rt.metrics.registry.get_sample_value("appliance_trace_write_errors_total") == 1
    assert rt.profiler.writer.last_error is not None
    assert str(blocker) in rt.profiler.writer.last_error
    assert str(blocker) in asyncio.run(ready_body(rt))["profiling"]["last_write_error"]


async def ready_body(rt: Runtime) -> dict[str, Any]:
    """GET /ready of the real HTTP app over a real loopback socket."""
    from aiohttp.test_utils import TestClient, TestServer

    from appliance.server.app import build_app
    from appliance.server.auth import AuthPolicy

    async with TestClient(TestServer(build_app(rt, AuthPolicy()))) as client:
        resp = await client.get("/ready")
        body: dict[str, Any] = await resp.json()
        return body


def test_sampling_and_disabling(tmp_path: Path) -> None:
    run(tmp_path / "a", {"dir": "t", "rotate_s": 600, "sample_every_n_frames": 10})
    doc = tracecheck.load(next((tmp_path / "a" / "t" / "rolling").glob("*.json")))
    runs = [e for e in doc["traceEvents"] if e["name"] == "workflow.run"]
    assert len(runs) == FRAMES // 10
    run(tmp_path / "b", {"dir": "t", "enabled": False})
    assert not (tmp_path / "b" / "t").exists()


def test_retention_keeps_the_newest_files(tmp_path: Path) -> None:
    tracer = Tracer()
    writer = RollingWriter(tracer, tmp_path, keep_files=2, compress=True)
    written = []
    for i in range(4):
        tracer.span("x", "block", float(i), float(i) + 0.5)
        path = writer.rotate()
        assert path is not None
        written.append(path.name)
    left = sorted(p.name for p in (tmp_path / "rolling").iterdir())
    assert left == sorted(written[-2:])
    assert writer.rotate() is None  # nothing new: no empty file


def three_streams(tmp_path: Path) -> Any:
    """cam and lobby run workflow people on one person detector (batched together), door
    runs privacy on CenterFace: two workflows, two batchers, three streams."""
    faces = {
        "path": str(MODELS / "centerface.onnx"),
        "decoder": "centerface",
        "labels": ["face"],
        "input_size": [320, 192],
        "providers": ["cpu"],
    }
    people = {
        "name": "people",
        "blocks": [
            {"id": "people", "type": "detect", "model": "person"},
            {"id": "drawn", "type": "annotate", "detections": "people"},
        ],
        "outputs": {"video": "drawn"},
    }
    privacy = {
        "name": "privacy",
        "blocks": [
            {"id": "faces", "type": "detect", "model": "faces"},
            {"id": "hidden", "type": "blur", "detections": "faces", "method": "pixelate"},
            {"id": "drawn", "type": "annotate", "image": "hidden", "detections": "faces"},
        ],
        "outputs": {"video": "drawn"},
    }
    source = {"url": str(DEMO_CLIP), "pace": "fast"}
    doc = {
        "profiling": {"dir": "traces", "rotate_s": 600},
        "models": {"person": person_model(max_batch_size=4, max_queue_delay_ms=20), "faces": faces},
        "streams": [
            {"id": "cam", "source": source, "workflow": people, "draw": "always"},
            {"id": "lobby", "source": source, "workflow": people, "draw": "always"},
            {"id": "door", "source": source, "workflow": privacy, "draw": "always"},
        ],
    }
    return parse_config(doc, tmp_path)


def test_two_workflows_read_right_in_perfetto(tmp_path: Path) -> None:
    path = tracecheck.run_to_rolling_trace(three_streams(tmp_path), FRAMES, 90)
    doc = tracecheck.load(path)
    tracecheck.check(doc)
    events = doc["traceEvents"]
    spans = [e for e in events if e["ph"] == "X"]
    check_counter_tracks(events, spans)
    check_wait_to_batch_flows(events, spans)
    # `trace summarize`: a row per stream and block, one hot spot per workflow.
    fp = fingerprint_file(path)
    for row in ("cam/people", "lobby/people", "door/faces", "cam/drawn", "door/drawn"):
        assert fp["blocks"][row]["count"] == FRAMES  # one stream's runs, not both
    assert fp["blocks"]["door/drawn"]["workflow"] == "privacy"
    hot = sorted(h.partition("block time of ")[2] for h in fp["hints"] if "hot spot" in h)
    assert hot == [
        "workflow people (streams cam, lobby): its hot spot",
        "workflow privacy (streams door): its hot spot",
    ]


def check_counter_tracks(events: list[dict[str, Any]], spans: list[dict[str, Any]]) -> None:
    """Perfetto draws one counter track per process and name (+ id): each must hold one
    stream's frame ages or one batcher's batch sizes, in time order."""
    tracks = perfetto.counter_tracks(events)
    pid = spans[0]["pid"]
    for stream in ("cam", "lobby", "door"):
        runs = sorted(
            (e for e in spans if e["name"] == "workflow.run" and e["args"]["stream"] == stream),
            key=lambda e: e["ts"] + e["dur"],
        )
        ages = [value for _, value in tracks[(pid, f"frame_age_ms:{stream} value")]]
        assert ages == [e["args"]["age_ms"] for e in runs]
    for model in ("person", "faces"):
        batches = [e for e in spans if e["name"] == "session.run" and e["args"]["model"] == model]
        sizes = [value for _, value in tracks[(pid, f"batch_size:{model} value")]]
        assert sizes == [e["args"]["batch_size"] for e in batches]
    assert len(tracks) == 3 + 2 * 2  # frame ages; batch sizes and queue depths


def check_wait_to_batch_flows(events: list[dict[str, Any]], spans: list[dict[str, Any]]) -> None:
    """A flow from every sample's queue.wait to the session.run that served it, bound as
    Perfetto binds them: on each end's own thread, its event inside the slice."""
    flows, unbound = perfetto.read_flows(events)
    assert not unbound
    waits = [f for f in flows if f.source.name == "queue.wait"]
    assert len(waits) == sum(e["name"] == "queue.wait" for e in spans) == 3 * FRAMES
    for f in waits:
        wait, run = f.source, f.target
        assert run.name == "session.run" and run.args["model"] == wait.args["model"]
        assert wait.args["stream"] in run.args["streams"]
        assert wait.end == run.ts  # the wait ends when its batch starts
        assert wait.ts <= f.source_ts <= wait.end and run.ts <= f.target_ts <= run.end
        assert wait.tid != run.tid
    served = Counter(f.target.index for f in waits)
    runs = {i: e for i, e in enumerate(events) if e["ph"] == "X" and e["name"] == "session.run"}
    assert served == {i: e["args"]["batch_size"] for i, e in runs.items()}  # each sample, once


def test_one_batch_of_two_streams_draws_an_arrow_from_each_wait() -> None:
    """The many-to-one case, recorded on real threads as the runtime does: two workers,
    each inside its detect block, and a batcher serving both in one run."""
    tracer = Tracer()
    t0 = time.perf_counter()

    def worker(stream: str) -> None:
        tracer.bind_stream(stream)
        tracer.span("people", "block", t0, t0 + 0.050, {"stream": stream, "type": "detect"})

    def batcher() -> None:
        record = BatchRecord("person", 2, ("cam", "lobby"), (0.010, 0.004), t0 + 0.020, 0.015)
        trace_batch(tracer, record)

    for target, args in ((worker, ("cam",)), (worker, ("lobby",)), (batcher, ())):
        thread = threading.Thread(target=target, args=args)
        thread.start()
        thread.join()
    events = tracer.drain()
    tracecheck.check({"traceEvents": events})
    flows, unbound = perfetto.read_flows(events)
    assert not unbound
    assert sorted((f.source.args["stream"], f.source.tid) for f in flows) == [
        ("cam", 1),
        ("lobby", 2),
    ]
    (run,) = {f.target for f in flows}
    assert (run.name, run.tid, run.args["streams"]) == ("session.run", 3, ["cam", "lobby"])
    for f in flows:
        assert f.source.name == "queue.wait" and f.source.end == run.ts
        assert f.source.ts == f.source_ts and f.target_ts == run.ts
    tracks = perfetto.counter_tracks(events)
    assert tracks[(tracer.pid, "batch_size:person value")] == [(run.ts, 2.0)]
    # Each flow event names its stream: a window kept for one stream keeps its arrows.
    flow_events = [e for e in events if e["ph"] in ("s", "f")]
    assert sorted(e["args"]["stream"] for e in flow_events) == ["cam", "cam", "lobby", "lobby"]


class OneBlock:
    """What StreamTrace reads of a compiled workflow."""

    name = "people"
    block_ids = ("people",)
    block_types = ("detect",)


def frame(seq: int, t: float) -> FrameResult:
    image = np.zeros((1, 1, 3), np.uint8)
    return FrameResult("cam", seq, None, t, t, t, t + 0.01, image, {}, [(t, t + 0.005)])


def test_a_frame_flow_needs_its_decode_traced() -> None:
    """A run ends a flow only when its frame's decode started one: not for a single image
    (no grabber), nor, when sampling, for a run whose decode was not sampled (decodes are
    sampled by seq, runs by count: frames dropped in between shift one against the other)."""
    tracer = Tracer()
    StreamTrace(tracer, "cam", OneBlock)(frame(0, 1.0))  # type: ignore[arg-type]
    assert "bind_id" not in next(e for e in tracer.drain() if e["name"] == "workflow.run")

    tracer = Tracer()
    trace = StreamTrace(tracer, "cam", OneBlock, every_n=2)  # type: ignore[arg-type]
    for seq in range(1, 7):
        trace.grabbed(seq, float(seq), seq + 0.0004, seq + 0.001)
        if seq not in (3, 6):  # dropped: decoded, never run
            trace(frame(seq, seq + 0.002))
    events = tracer.drain()
    runs = [e for e in events if e["name"] == "workflow.run"]
    assert [(e["args"]["seq"], "bind_id" in e) for e in runs] == [(2, True), (5, False)]
    assert [e["args"]["seq"] for e in events if e["name"] == "grab"] == [2, 4, 6]
    flows, _ = perfetto.read_flows(events)
    assert [(f.source.args["seq"], f.target.args["seq"]) for f in flows] == [(2, 2)]


def test_a_grab_splits_into_its_read_and_its_decode() -> None:
    """The wait for the camera (`read`) and the decode to BGR (`decode`) nest in the
    frame's `grab` span on the grabber's track; data read before the grab began (a
    decoder that held a frame back) counts as no read at all."""
    tracer = Tracer()
    trace = StreamTrace(tracer, "cam", OneBlock)  # type: ignore[arg-type]
    trace.grabbed(7, 1.0, 1.0004, 1.001)
    trace.grabbed(8, 2.0, 1.5, 2.001)  # received before this grab's read began
    spans = [e for e in tracer.drain() if e["ph"] == "X"]
    by_name = {n: [e for e in spans if e["name"] == n] for n in ("grab", "read", "decode")}
    assert [len(v) for v in by_name.values()] == [2, 2, 2]
    (grab, late_grab), (read, late_read), (decode, late_decode) = by_name.values()
    assert (read["ts"], read["dur"]) == (grab["ts"], 400)  # µs
    assert read["ts"] + read["dur"] == decode["ts"]
    assert decode["ts"] + decode["dur"] == grab["ts"] + grab["dur"]
    assert {e["tid"] for e in spans} == {grab["tid"]}
    assert late_read["dur"] == 0
    assert late_decode["ts"] == late_grab["ts"]  # inside its grab, not before it


def test_a_restarted_stream_keeps_its_frame_flows_apart() -> None:
    """Two streams of one id in one trace (a restart while the old worker still finishes
    a frame): both number frames from 0, yet each decode's arrow ends at its own run."""
    tracer = Tracer()
    old = StreamTrace(tracer, "cam", OneBlock, generation=0)  # type: ignore[arg-type]
    new = StreamTrace(tracer, "cam", OneBlock, generation=1)  # type: ignore[arg-type]
    old.grabbed(0, 1.0, 1.0001, 1.0002)
    new.grabbed(0, 1.0005, 1.0006, 1.0007)
    old(frame(0, 1.002))
    new(frame(0, 1.004))
    flows, unbound = perfetto.read_flows(tracer.drain())
    assert unbound == []
    arrows = sorted((f.source.ts, f.target.ts - f.source.ts) for f in flows)
    assert [gap for _, gap in arrows] == [2000, 3500]  # µs: grab start -> its own run
