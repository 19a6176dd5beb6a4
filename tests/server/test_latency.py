"""A stream's recent per-block latency: the ring itself on made-up results (exact
percentiles, skipped blocks, the window's wrap), then `GET /v1/streams/{id}/latency` on a
live server running the bundled clip through a real detector, across a restart."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from appliance.errors import UnknownStreamError
from appliance.observe.blocklatency import BlockLatencies, LatencyRing
from pipelines.types import FrameResult
from tests.server.conftest import WAIT_S, LiveFactory, config_doc
from tests.server.live import LiveServer, wait_for
from tests.support.appliance import DEMO_CLIP
from tests.support.processes import free_port

BLOCKS = [("people", "detect"), ("gate", "rate_limit"), ("tracks", "track")]
EVERY_N = 3  # the gate passes one frame in 3: `tracks` runs on those only


def result(seq: int, spans: list[tuple[float, float] | None], stream: str = "cam") -> FrameResult:
    """A frame whose workflow ran from 0 to the last span's end (`done` = seq s)."""
    ends = [s[1] for s in spans if s is not None]
    start = seq - max(ends, default=0.0)
    shifted = [None if s is None else (start + s[0], start + s[1]) for s in spans]
    image = np.zeros((1, 1, 3), np.uint8)
    return FrameResult(stream, seq, None, 0.0, 0.0, start, float(seq), image, {}, shifted)


def test_the_ring_gives_exact_percentiles_in_workflow_order() -> None:
    ring = LatencyRing("cam", BLOCKS, size=64)
    for i in range(40):  # detect i ms, gate 0.5 ms, tracks 2 ms on every 4th frame
        ms = i / 1000
        span = (ms + 0.0005, ms + 0.0025) if i % 4 == 0 else None
        ring(result(i + 1, [(0.0, ms), (ms, ms + 0.0005), span]))
    report = ring.report()
    assert (report.stream, report.window, report.frames) == ("cam", 64, 40)
    assert [(b.id, b.type) for b in report.blocks] == BLOCKS
    people, gate, tracks = report.blocks
    assert people.frames == gate.frames == 40 and tracks.frames == 10
    assert people.p50_ms == pytest.approx(np.percentile(np.arange(40), 50))
    assert people.p99_ms == pytest.approx(np.percentile(np.arange(40), 99))
    assert tracks.p50_ms == pytest.approx(2.0) and gate.p99_ms == pytest.approx(0.5)
    assert report.fps == pytest.approx(1.0)  # one result per second of `done`
    assert people.p99_ms is not None and report.workflow.p99_ms is not None
    assert report.workflow.p99_ms > people.p99_ms


def test_the_ring_keeps_only_its_window_and_ignores_another_workflow() -> None:
    ring = LatencyRing("cam", BLOCKS[:1], size=8)
    assert ring.report().frames == 0 and ring.report().blocks[0].p50_ms is None
    for i in range(20):  # the last 8 took 12..19 ms
        ring(result(i + 1, [(0.0, i / 1000)]))
    ring(result(21, [(0.0, 1.0), (1.0, 2.0)]))  # two blocks: not this ring's workflow
    report = ring.report()
    assert report.frames == 8
    assert report.blocks[0].p50_ms == pytest.approx(15.5)
    assert report.blocks[0].p99_ms == pytest.approx(np.percentile(np.arange(12, 20), 99))


def test_rings_follow_the_streams_attached() -> None:
    rings = BlockLatencies(size=4)
    rings.attach("a", BLOCKS[:1])
    rings(result(1, [(0.0, 0.001)], stream="a"))
    rings(result(1, [(0.0, 0.001)], stream="b"))  # not attached: ignored
    assert rings.report("a").frames == 1
    rings.attach("a", BLOCKS[:1])  # restarted: a fresh window
    assert rings.report("a").frames == 0
    rings.detach("a")
    with pytest.raises(UnknownStreamError):
        rings.report("a")


# -- over HTTP, on a live server ----------------------------------------------------------
def gated_stream(stream_id: str) -> dict[str, object]:
    """The bundled clip as a live camera: detect, a gate, a tracker behind the gate."""
    workflow = {
        "name": "gated_tracks",
        "blocks": [
            {"id": "people", "type": "detect", "model": "person", "confidence": 0.4},
            {"id": "gate", "type": "rate_limit", "value": "people", "every_n_frames": EVERY_N},
            {"id": "tracks", "type": "track", "detections": "gate"},
        ],
        "outputs": {"people": "people", "tracks": "tracks"},
    }
    source = {"url": str(DEMO_CLIP), "loop": True, "pace": "realtime"}
    return {"id": stream_id, "source": source, "workflow": workflow}


@pytest.fixture(scope="module")
def server(module_server: LiveFactory) -> LiveServer:
    live = module_server(config_doc(gated_stream("cam")))
    wait_for(lambda: latency(live)["frames"] >= 2 * EVERY_N, WAIT_S, "cam's first frames")
    return live


def latency(server: LiveServer, stream_id: str = "cam") -> dict[str, Any]:
    return dict(server.get_json(f"/v1/streams/{stream_id}/latency"))


def test_the_route_reports_each_block_in_workflow_order(server: LiveServer) -> None:
    report = server.get_json("/v1/streams/cam/latency")
    assert report["stream"] == "cam" and report["window"] == 256
    assert 0 < report["frames"] <= 256 and report["fps"] > 0
    assert [(b["id"], b["type"]) for b in report["blocks"]] == BLOCKS
    for span in [report["workflow"], *report["blocks"]]:
        assert 0 <= span["p50_ms"] <= span["p99_ms"], span
    people, gate, tracks = report["blocks"]
    assert people["frames"] == gate["frames"] == report["frames"]
    assert 0 < tracks["frames"] < people["frames"]  # skipped while the gate holds
    assert people["p99_ms"] <= report["workflow"]["p99_ms"] + 1e-3


def test_unknown_streams_and_missing_tokens_are_refused(server: LiveServer) -> None:
    missing = server.call("GET", "/v1/streams/nope/latency")
    assert missing.status == 404 and missing.error["code"] == "not_found"
    assert "nope" in missing.error["message"]
    refused = server.call("GET", "/v1/streams/cam/latency", token=False)
    assert refused.status == 401 and refused.error["code"] == "unauthorized"


def test_a_restart_starts_a_fresh_window_and_a_removal_ends_it(server: LiveServer) -> None:
    wait_for(lambda: latency(server)["frames"] >= 20, WAIT_S, "frames to add up")
    before = latency(server)["frames"]
    assert server.call("POST", "/v1/streams/cam/restart").status == 200
    assert latency(server)["frames"] < before  # the old window went with the old stream
    wait_for(lambda: latency(server)["frames"] > 0, WAIT_S, "the restarted stream's frames")
    added = server.call("POST", "/v1/streams", json_body=gated_stream("second"))
    assert added.status == 201, added.body
    wait_for(lambda: latency(server, "second")["frames"] > 0, WAIT_S, "second's frames")
    assert server.call("DELETE", "/v1/streams/second").status == 200
    assert server.call("GET", "/v1/streams/second/latency").status == 404


def test_the_scene_gives_the_lines_and_zones_a_stream_counts(server: LiveServer) -> None:
    """A stream whose camera never answers still has its compiled workflow: enough."""
    workflow = {
        "name": "door",
        "blocks": [
            {"id": "people", "type": "detect", "model": "person"},
            {"id": "tracks", "type": "track", "detections": "people"},
            {"id": "door", "type": "line_counter", "tracks": "tracks",
             "line": [[0.1, 0.6], [0.9, 0.6]]},
            {"id": "dock", "type": "zone_counter", "tracks": "tracks", "units": "px",
             "zone": [[10, 10], [200, 10], [200, 120]]},
        ],
        "outputs": {"door": "door", "dock": "dock"},
    }  # fmt: skip
    dead = {"url": f"rtsp://127.0.0.1:{free_port()}/nothing"}
    body = {"id": "doorcam", "source": dead, "workflow": workflow}
    assert server.call("POST", "/v1/streams", json_body=body).status == 201
    try:
        assert server.get_json("/v1/streams/doorcam/scene") == {"stream": "doorcam", "regions": [
            {"block": "door", "kind": "line", "points": [[0.1, 0.6], [0.9, 0.6]], "units": "norm"},
            {"block": "dock", "kind": "zone", "points": [[10, 10], [200, 10], [200, 120]],
             "units": "px"},
        ]}  # fmt: skip
    finally:
        server.call("DELETE", "/v1/streams/doorcam")
    assert server.get_json("/v1/streams/cam/scene") == {"stream": "cam", "regions": []}
    assert server.call("GET", "/v1/streams/nope/scene").status == 404
    assert server.call("GET", "/v1/streams/cam/scene", token=False).status == 401
