"""The slowest frames of a live stream (GET /v1/streams/{id}/slowest, `appliance streams
slowest`): frames made slow by real work come first, with the slow block named, and each
row's trace link answers that frame's trace.

The work: a person detector on every frame, and CenterFace at 960x544 on one frame in
eight only (`rate_limit`), on one intra-op thread: those frames cost several times the
others, for real."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.server.conftest import TOKEN, config_doc, demo_stream
from tests.server.live import LiveServer, wait_for, write_yaml
from tests.support import tracecheck
from tests.support.appliance import MODELS, ROOT, clean_env
from tests.support.warm_cli import run_appliance

EVERY = 8  # frames: one in EVERY runs the heavy block
WORKFLOW = {
    "name": "sometimes_faces",
    "models": {
        "faces": {
            "path": str(MODELS / "centerface.onnx"),
            "decoder": "centerface",
            "labels": ["face"],
            "providers": ["cpu"],
            "input_size": [960, 544],
            "session": {"intra_op_threads": 1, "allow_spinning": False},
        }
    },
    "blocks": [
        {"id": "people", "type": "detect", "model": "person", "confidence": 0.4},
        {"id": "sometimes", "type": "rate_limit", "value": "frame", "every_n_frames": EVERY},
        {"id": "faces", "type": "detect", "model": "faces", "image": "sometimes"},
    ],
    "outputs": {"people": "people", "faces": "faces"},
}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    folder = tmp_path_factory.mktemp("slowest")
    stream = {**demo_stream("cam"), "workflow": WORKFLOW}
    live = LiveServer(write_yaml(folder, config_doc(stream), "config.yaml"), token=TOKEN)
    live.start()
    try:
        wait_for(lambda: live.stream("cam")["frames_processed"] >= 4 * EVERY, 60.0, "frames")
        yield live
    finally:
        live.stop()


def test_frames_that_ran_the_heavy_block_come_first_with_it_named(server: LiveServer) -> None:
    report = server.get_json("/v1/streams/cam/slowest?since=10m&limit=3")
    frames = report["frames"]
    assert report["stream"] == "cam" and len(frames) == 3
    for row in frames:
        blocks = {b["id"]: b["ms"] for b in row["blocks"]}
        assert row["slowest_block"] == "faces" and blocks["faces"] is not None, row
        assert blocks["faces"] > blocks["people"]
        assert {m["model"] for m in row["models"]} >= {"faces"}
        assert row["trace"] == f"/v1/streams/cam/frames/{row['seq']}/trace"
    totals = [row["total_ms"] for row in frames]
    assert totals == sorted(totals, reverse=True)
    # Every frame the heavy block skipped is faster than the slowest ones listed.
    everything = server.get_json("/v1/streams/cam/slowest?since=10m&limit=10")["frames"]
    skipped = [r for r in everything if r["blocks"][2]["ms"] is None]
    assert all(r["total_ms"] < frames[-1]["total_ms"] for r in skipped)

    reply = server.call("GET", frames[0]["trace"])
    assert reply.status == 200, reply.body
    doc = reply.json()
    tracecheck.check(doc)
    seq = frames[0]["seq"]
    runs = [e for e in doc["traceEvents"] if e["name"] == "workflow.run"]
    assert seq in [e["args"]["seq"] for e in runs]
    assert any(e["name"] == "faces" for e in doc["traceEvents"])


def test_requests_out_of_bounds_are_refused_naming_the_parameter(server: LiveServer) -> None:
    for query, name in (("since=yesterday", "since"), ("limit=0", "limit"), ("limit=11", "limit"),
                        ("since=2026-12-07T10:00:00", "since")):  # fmt: skip
        reply = server.call("GET", f"/v1/streams/cam/slowest?{query}")
        assert reply.status == 422 and reply.json()["error"]["message"].startswith(name), query
    for path in ("/v1/streams/cam/slowest?limt=3", "/v1/streams/cam/frames/1/trace?arround=1"):
        reply = server.call("GET", path)  # a misspelt parameter is not the default
        assert reply.status == 422 and "unknown (known: " in reply.json()["error"]["details"][0]
    assert server.call("GET", "/v1/streams/nope/slowest").status == 404
    for path in ("/v1/streams/cam/frames/x1/trace", "/v1/streams/cam/frames/1/trace?around=99"):
        assert server.call("GET", path).status == 422, path
    assert server.call("GET", "/v1/streams/nope/frames/1/trace").status == 404
    assert server.call("GET", "/v1/streams/cam/slowest", token=None).status == 401


def test_the_cli_prints_them_as_a_table(server: LiveServer, tmp_path: Path) -> None:
    args = ("streams", "slowest", "cam", "--since", "10m", "--limit", "2")
    done = cli(server, *args)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].startswith("cam: the 2 slowest frames since ")
    assert lines[1].split() == ["seq", "captured", "total", "ms", "age", "ms", "slowest",
                                "block", "batch", "queue", "ms", "trace"]  # fmt: skip
    rows = [re.split(r"\s+", line.strip()) for line in lines[2:]]
    assert len(rows) == 2 and all(r[4] == "faces" for r in rows), lines
    seq = rows[0][0]
    assert rows[0][-1] == f"/v1/streams/cam/frames/{seq}/trace"
    out = tmp_path / "frame.json"
    done = cli(server, "streams", "frame", "cam", seq, "-o", str(out))
    assert done.returncode == 0, done.stderr
    tracecheck.check(tracecheck.load(out))


def cli(server: LiveServer, *args: str) -> Any:
    argv = (*args, "--url", f"http://127.0.0.1:{server.port}", "--token", TOKEN)
    return run_appliance(argv, timeout=30, cwd=ROOT, env=clean_env())
