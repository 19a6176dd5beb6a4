"""Continuous tracing through the real runtime: rolling files that pass a strict format
check, spans that match what was processed, write failures that stop nothing."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from appliance.config import parse_config
from appliance.profiling.rolling import RollingWriter
from appliance.profiling.tracer import Tracer
from appliance.runtime import Runtime
from appliance.tools.fingerprint import fingerprint_file
from tests.support import tracecheck
from tests.support.appliance import DEMO_CLIP, person_model

FRAMES = 30


def config(tmp_path: Path, profiling: dict[str, Any], frames_from: Path = DEMO_CLIP) -> Any:
    doc = {
        "profiling": profiling,
        "models": {"person": person_model()},
        "streams": [
            {
                "id": "cam",
                "source": {"url": str(frames_from), "pace": "fast"},
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
        assert any(d["tid"] == w["tid"] and d["ts"] <= w["ts"] and
                   w["ts"] + w["dur"] <= d["ts"] + d["dur"] for d in detects), w  # fmt: skip
    names = {e["args"]["name"] for e in doc["traceEvents"] if e["name"] == "thread_name"}
    assert {"work:cam", "grab:cam", "batch:person"} <= names
    # Every frame was read and decoded on the grabber's track, and a flow links it to the
    # workflow run that processed it, on another thread.
    grabs = {e["args"]["seq"]: e for e in events if e["name"] == "grab"}
    assert set(range(FRAMES)) <= set(grabs)
    starts = {e["id"]: e for e in doc["traceEvents"] if e["ph"] == "s"}
    ends = {e["id"]: e for e in doc["traceEvents"] if e["ph"] == "f"}
    assert len(ends) == FRAMES
    for wf in runs:
        flow_id = next(i for i, f in ends.items() if f["ts"] == wf["ts"] and f["tid"] == wf["tid"])
        grab = grabs[wf["args"]["seq"]]
        assert starts[flow_id]["tid"] == grab["tid"] != wf["tid"]
        assert grab["ts"] <= starts[flow_id]["ts"] <= grab["ts"] + grab["dur"]
    # The histograms counted the same frames the trace shows.
    count = rt.metrics.registry.get_sample_value(
        "appliance_block_latency_seconds_count",
        {"stream": "cam", "block": "people", "type": "detect"},
    )
    assert count == FRAMES
    assert rt.metrics.registry.get_sample_value("appliance_trace_files_written_total") == 1
    # `trace summarize` on this real trace names the real hot spot: the detector.
    blocks = fingerprint_file(files[0])["blocks"]
    assert max(blocks, key=lambda b: blocks[b]["share"]) == "people"
    assert blocks["people"]["count"] == blocks["drawn"]["count"] == FRAMES


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
