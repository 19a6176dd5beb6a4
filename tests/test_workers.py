"""`appliance serve --workers N`: real worker processes behind one API.

Every stream runs in exactly one worker (the sharding rule), the API answers for all of
them, /metrics carries each stream's series once with its `worker`, a profiling window
is one trace with a process track per worker, a killed worker is started again while
the other's streams go on, and SIGTERM stops everything.

The tests that start an appliance of their own come first. One appliance (`two`) serves
the rest, in this order: the read-only tests, a stream added and removed, a worker
killed and started again, then the reloads and SIGTERM, which end it. Nothing else runs
beside it on this 2-core machine (a module fixture lives until the module ends).
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import socket
import subprocess
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from aiortc import RTCSessionDescription

from appliance.runtime.sharding import assign
from appliance.workers.merge import merge_metrics, merge_traces
from tests.support.appliance import (
    APPLIANCE,
    DEMO_CLIP,
    Served,
    clean_env,
    detect_workflow,
    person_model,
    start_served,
)
from tests.support.warm_cli import run_appliance
from tests.support.webrtc import recvonly_offer

STREAMS = ["cam-a", "cam-b", "cam-c"]


def config_doc(tmp_path: Path, **server: Any) -> dict[str, Any]:
    return {
        "server": {"drain_timeout_s": 3, "file_roots": [str(tmp_path), str(DEMO_CLIP.parent)],
                   **server},
        # Every 4th batch on the profiled session (default 16): a 1.5 s window then samples
        # several batches of the one-stream worker, not only its first, which may run
        # before the window's span begins (its operators then have no span to go in).
        "profiling": {"dir": str(tmp_path / "traces"), "ort_sample_every_n_batches": 4},
        "models": {"person": person_model()},
        "webrtc": {"host_addresses": ["127.0.0.1"]},  # loopback ICE (TESTBED.md)
        "streams": [
            {"id": s, "source": {"url": str(DEMO_CLIP), "pace": "realtime"},
             "workflow": detect_workflow()}
            for s in STREAMS
        ],
    }  # fmt: skip


def running(served: Served) -> dict[str, Any]:
    return {s["id"]: s for s in served.json("/v1/streams")["streams"]}


def all_processing(served: Served) -> bool:
    streams = running(served)
    return len(streams) == len(STREAMS) and all(s["frames_processed"] > 0 for s in streams.values())


def test_a_token_is_asked_by_the_gateway(tmp_path: Path, serve: Callable[..., Served]) -> None:
    config = tmp_path / "config.yaml"
    doc = config_doc(tmp_path, token="s3cret-token")
    doc["streams"] = doc["streams"][:2]
    config.write_text(json.dumps(doc))
    served = serve(config, "--workers", "2", env=clean_env())
    served.wait_for(lambda: served.get("/ready")[0] == 200, 60, "both workers ready")
    assert request(served, "GET", "/v1/streams")[0] == 401
    assert request(served, "GET", "/v1/streams/cam-a/latest")[0] == 401
    wrong = {"Authorization": "Bearer guess"}
    assert request(served, "GET", "/v1/streams", headers=wrong)[0] == 401
    assert served.get("/metrics")[0] == 200  # probes: open on loopback, as in one process
    auth = {"Authorization": "Bearer s3cret-token"}
    status, body = request(served, "GET", "/v1/streams", headers=auth)
    assert status == 200 and {s["id"] for s in body["streams"]} == set(STREAMS[:2])
    # Nothing but the gateway listens: each worker's socket sits in a folder only this
    # user may enter, and no worker's command line carries the token.
    for worker in served.json("/ready")["workers"]:
        argv = Path(f"/proc/{worker['pid']}/cmdline").read_bytes().split(b"\0")
        assert not any(b"s3cret-token" in arg for arg in argv)
        socket_path = Path(argv[argv.index(b"--unix") + 1].decode())
        assert socket_path.is_socket()
        assert socket_path.parent.stat().st_mode & 0o777 == 0o700


def test_a_worker_that_cannot_start_stops_the_appliance(
    tmp_path: Path, serve: Callable[..., Served]
) -> None:
    broken = tmp_path / "broken.onnx"
    broken.write_bytes(b"not an onnx model")  # exists (the config check passes), loads not
    doc = config_doc(tmp_path)
    doc["models"]["person"]["path"] = str(broken)
    config = tmp_path / "config.yaml"
    config.write_text(json.dumps(doc))
    served = serve(config, "--workers", "2")  # the gateway answers /health at once
    assert served.process.wait(60) == 1
    assert "could not start" in served.log()
    assert str(broken) in served.log()  # the worker's own error names the file


def test_merge_metrics_adds_the_worker_label_and_keeps_one_family() -> None:
    """The workers answer the gateway in OpenMetrics; the merge keeps their exemplars
    (the frames behind a bucket) for a scraper that asks for OpenMetrics."""
    bucket = 'x_bucket{stream="a",le="+Inf"} 3.0 # {trace_id="a/frames/7"} 0.5 1796104205.0'
    one = (
        "# HELP x X.\n# TYPE x histogram\n"
        + bucket
        + '\nx_count{stream="a"} 3.0\nx_sum{stream="a"} 1.5\n# EOF\n'
    )
    two = (
        '# HELP x X.\n# TYPE x histogram\nx_bucket{stream="b",le="+Inf"} 4.0\n'
        'x_count{stream="b"} 4.0\nx_sum{stream="b"} 2.0\n# EOF\n'
    )
    text = merge_metrics({0: one, 1: two}).decode()
    assert text.count("# TYPE x histogram") == 1
    assert 'x_count{stream="a",worker="0"} 3.0' in text
    assert 'x_count{stream="b",worker="1"} 4.0' in text
    assert "trace_id" not in text  # the classic format has no exemplars
    om = merge_metrics({0: one, 1: two}, openmetrics=True).decode()
    assert 'x_bucket{le="+Inf",stream="a",worker="0"} 3.0 # {trace_id="a/frames/7"} 0.5' in om
    assert om.endswith("# EOF\n")


def test_merge_traces_names_each_worker_track() -> None:
    meta = {"name": "process_name", "ph": "M", "tid": 0, "args": {"name": "appliance"}}
    traces: dict[int, dict[str, Any]] = {
        i: {"traceEvents": [{**meta, "pid": 100 + i}, {"name": "s", "ph": "X", "pid": 100 + i}]}
        for i in (0, 1)
    }
    merged = merge_traces(traces)
    assert merged["otherData"]["worker_pids"] == {"0": 100, "1": 101}
    names = [e["args"]["name"] for e in merged["traceEvents"] if e["ph"] == "M"]
    assert names == ["appliance worker 0", "appliance worker 1"]
    assert traces[0]["traceEvents"][0]["args"]["name"] == "appliance"  # inputs untouched


def test_a_port_in_use_starts_no_worker(tmp_path: Path) -> None:
    config = tmp_path / "config.yaml"
    config.write_text(json.dumps(config_doc(tmp_path)))
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = subprocess.run(
            [*APPLIANCE, "serve", "--config", str(config), "--port", str(port), "--workers", "2"],
            capture_output=True, text=True, timeout=60, env=clean_env(), check=False,
        )  # fmt: skip
    assert done.returncode == 1
    assert f"cannot listen on 127.0.0.1:{port}" in done.stderr
    assert "worker 0 started" not in done.stderr


@pytest.fixture(scope="module")
def two_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The folder of `two`: its config.yaml is `config_doc` of this folder."""
    return tmp_path_factory.mktemp("workers")


@pytest.fixture(scope="module")
def two(two_folder: Path) -> Iterator[Served]:
    """One appliance with two workers for the rest of this module (see its docstring)."""
    config = two_folder / "config.yaml"
    config.write_text(json.dumps(config_doc(two_folder)))
    # Shard 0 of 1 (every stream): a replica's shard, split again between its workers.
    served = start_served(config, two_folder, "--workers", "2", "--shard", "0/1")
    try:
        served.wait_for(lambda: all_processing(served), 60, "every stream to process")
        yield served
    finally:
        served.stop()


def test_each_stream_runs_in_the_worker_the_sharding_rule_names(two: Served) -> None:
    streams = running(two)
    expected = assign(STREAMS, 2)
    assert {i: s["worker"] for i, s in streams.items()} == expected
    assert set(expected.values()) == {0, 1}  # both workers have work: the test means it
    ready = two.json("/ready")
    assert ready["ready"] is True
    pids = [w["pid"] for w in ready["workers"]]
    assert len(set(pids)) == 2 and os.getpid() not in pids
    assert [w["state"] for w in ready["workers"]] == ["up", "up"]
    # Each worker's own answer, through the gateway: the stream's worker replies.
    for stream_id in STREAMS:
        one = two.json(f"/v1/streams/{stream_id}")
        assert one["id"] == stream_id and one["state"] == "running"
        assert two.get(f"/v1/streams/{stream_id}/latest")[0] == 200
    assert two.get("/v1/streams/nope/latest")[0] == 404


def test_metrics_carry_each_stream_once_with_its_worker(two: Served) -> None:
    status, body = two.get("/metrics")
    assert status == 200
    text = body.decode()
    placed = assign(STREAMS, 2)
    for stream_id, worker in placed.items():
        lines = [
            line for line in text.splitlines()
            if line.startswith("appliance_frames_total{") and f'stream="{stream_id}"' in line
            and 'outcome="processed"' in line
        ]  # fmt: skip
        assert len(lines) == 1, lines  # not counted twice
        assert f'worker="{worker}"' in lines[0]
        assert float(lines[0].rsplit(" ", 1)[1]) > 0
    assert 'appliance_worker_up{worker="0"} 1.0' in text
    assert 'appliance_worker_up{worker="1"} 1.0' in text
    assert text.count("# TYPE appliance_frames_total counter") == 1  # one family


def test_exemplars_keep_their_worker_and_their_links_through_the_gateway(two: Served) -> None:
    """The gateway's /metrics in OpenMetrics keeps the workers' exemplars; the link of
    one (its trace_id) through the gateway reaches the stream's worker and its trace, and
    the stream's slowest frames come from there too."""
    request = urllib.request.Request(
        two.url + "/metrics", headers={"Accept": "application/openmetrics-text; version=1.0.0"}
    )
    with urllib.request.urlopen(request, timeout=10) as resp:
        assert resp.headers["Content-Type"].startswith("application/openmetrics-text")
        text = resp.read().decode()
    assert text.endswith("# EOF\n")
    placed = assign(STREAMS, 2)
    stream_id = STREAMS[0]
    exemplars = [
        line for line in text.splitlines()
        if line.startswith("appliance_workflow_latency_seconds_bucket{")
        and f'stream="{stream_id}"' in line and " # {" in line
    ]  # fmt: skip
    assert exemplars and all(f'worker="{placed[stream_id]}"' in x for x in exemplars)
    trace_id = re.search(r'trace_id="([^"]+)"', exemplars[-1])
    assert trace_id and trace_id.group(1).startswith(f"{stream_id}/frames/")
    status, body = two.get(f"/v1/streams/{trace_id.group(1)}/trace")
    assert status == 200, body[:300]
    seq = int(trace_id.group(1).rsplit("/", 1)[1])
    runs = [e for e in json.loads(body)["traceEvents"] if e["name"] == "workflow.run"]
    assert seq in [e["args"]["seq"] for e in runs if e["args"]["stream"] == stream_id]
    status, body = two.get(f"/v1/streams/{stream_id}/slowest?since=10m")
    assert status == 200 and json.loads(body)["frames"], body[:300]
    assert "# {" not in two.get("/metrics")[1].decode()  # the classic format: none


def test_events_stream_through_the_gateway(two: Served) -> None:
    for stream_id in STREAMS:
        url = f"{two.url}/v1/streams/{stream_id}/events"
        with urllib.request.urlopen(url, timeout=10) as resp:
            assert resp.headers["Content-Type"].startswith("text/event-stream")
            data = b""
            while b"\n\n" not in data:
                data += resp.read1(4096)
        event = json.loads(data.split(b"data: ", 1)[1].split(b"\n", 1)[0])
        assert event["stream"] == stream_id


def test_status_shows_the_shard_and_the_workers(two: Served) -> None:
    done = run_appliance(["status", "--url", two.url], timeout=30, env=clean_env())
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].endswith("ok, ready (shard 0/1)"), lines[0]
    assert "workers: 2" in lines
    assert any(line.strip().startswith("1: up, pid ") for line in lines)
    assert "streams: 3, 3 running" in lines
    assert two.json("/ready")["shard"] == "0/1"


def test_a_profiling_window_is_one_trace_with_a_track_per_worker(two: Served) -> None:
    started = request(two, "POST", "/v1/profiling", {"duration_s": 1.5, "ort_operators": True})
    assert started[0] == 202
    window = started[1]["id"]
    two.wait_for(lambda: two.json(f"/v1/profiling/{window}")["state"] == "done", 30, "done")
    trace = two.json(f"/v1/profiling/{window}/trace")
    events = trace["traceEvents"]
    names = {e["pid"]: e["args"]["name"] for e in events if e.get("name") == "process_name"}
    assert sorted(names.values()) == ["appliance worker 0", "appliance worker 1"]
    pids = {w["pid"] for w in two.json("/ready")["workers"]}
    assert set(names) == pids  # each worker's own events, under its own pid
    spans = [e for e in events if e.get("ph") == "X"]
    for pid in pids:  # both workers traced their streams and their model's operators
        assert any(e["pid"] == pid and e.get("cat") == "Node" for e in spans)
        assert any(e["pid"] == pid and e["name"] == "session.run" for e in spans)
    # One timeline: the two workers' spans overlap in wall-clock time.
    ranges = [
        (min(e["ts"] for e in spans if e["pid"] == p), max(e["ts"] for e in spans if e["pid"] == p))
        for p in pids
    ]
    assert max(r[0] for r in ranges) < min(r[1] for r in ranges)
    assert request(two, "GET", "/v1/profiling/nope")[0] == 404


def request(served: Served, method: str, path: str, body: Any = None,
            headers: dict[str, str] | None = None) -> tuple[int, Any]:  # fmt: skip
    data = None if body is None else json.dumps(body).encode()
    headers = {"Content-Type": "application/json", **(headers or {})}
    req = urllib.request.Request(served.url + path, data=data, method=method, headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return resp.status, json.loads(resp.read() or b"null")
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read() or b"null")


def test_webrtc_viewers_reach_each_worker_through_the_gateway(two: Served) -> None:
    """The offer goes to the stream's worker, whose media goes straight to the viewer;
    the session ends through the gateway too (the worker that holds it answers)."""

    async def watch(stream_id: str) -> None:
        pc, frames, offer = await recvonly_offer()
        status, answer = await asyncio.to_thread(
            request, two, "POST", f"/v1/streams/{stream_id}/webrtc", offer
        )
        assert status == 201, answer
        try:
            await pc.setRemoteDescription(RTCSessionDescription(answer["sdp"], answer["type"]))
            frame = await asyncio.wait_for(frames.get(), 20)
            assert frame.width > 0
            path = f"/v1/webrtc/{answer['session_id']}"
            assert (await asyncio.to_thread(request, two, "DELETE", path))[0] == 204
            assert (await asyncio.to_thread(request, two, "DELETE", path))[0] == 404
        finally:
            await pc.close()

    placed = assign(STREAMS, 2)
    for worker in (0, 1):  # a viewer of a stream on each worker
        asyncio.run(watch(next(s for s, w in placed.items() if w == worker)))


def test_an_added_stream_goes_to_the_least_loaded_worker(two: Served) -> None:
    loads = [0, 0]
    for worker in assign(STREAMS, 2).values():
        loads[worker] += 1
    lighter = loads.index(min(loads))
    added = {"id": "cam-new", "source": {"url": str(DEMO_CLIP)}, "workflow": detect_workflow()}
    status, body = request(two, "POST", "/v1/streams", added)
    assert status == 201, body
    try:
        assert running(two)["cam-new"]["worker"] == lighter
        assert request(two, "POST", "/v1/streams", added)[0] == 409  # the id is taken
        two.wait_for(lambda: two.get("/v1/streams/cam-new/latest")[0] == 200, 20, "a result")
    finally:
        assert request(two, "DELETE", "/v1/streams/cam-new")[0] == 200
    assert "cam-new" not in running(two)
    assert request(two, "GET", "/v1/streams/cam-new")[0] == 404


def test_a_shadow_is_started_promoted_and_rolled_back_through_the_gateway(two: Served) -> None:
    """Shadow calls reach the worker that runs the stream; the promoted workflow's version
    is on its results there."""
    looping = {"url": str(DEMO_CLIP), "loop": True, "pace": "realtime"}
    added = {"id": "cam-shadow", "source": looping, "workflow": detect_workflow()}
    assert request(two, "POST", "/v1/streams", added)[0] == 201
    shadow = "/v1/streams/cam-shadow/shadow"
    try:
        candidate = {**detect_workflow(), "name": "stricter"}
        candidate["blocks"] = [{**candidate["blocks"][0], "confidence": 0.85}]
        status, body = request(two, "POST", shadow, {"workflow": candidate, "max_live_cost": 1})
        assert status == 201, body
        assert request(two, "POST", shadow, {"workflow": candidate})[0] == 409  # one a stream

        def compared() -> bool:
            return bool(request(two, "GET", shadow)[1]["comparison"]["frames"] >= 3)

        two.wait_for(compared, 30, "compared frames")
        status, promoted = request(two, "POST", f"{shadow}/promote", {"rollback_s": 60})
        assert status == 200, promoted
        assert request(two, "GET", shadow)[0] == 404  # promoted: no shadow any more

        def newest_is(version: str) -> bool:
            latest = two.get("/v1/streams/cam-shadow/latest")
            return latest[0] == 200 and json.loads(latest[1])["workflow"] == version

        two.wait_for(lambda: newest_is(promoted["workflow"]), 20, "a promoted result")
        status, back = request(two, "POST", f"{shadow}/rollback")
        assert status == 200 and back["workflow"] == promoted["previous"], back
        two.wait_for(lambda: newest_is(promoted["previous"]), 20, "a rolled back result")
    finally:
        assert request(two, "DELETE", "/v1/streams/cam-shadow")[0] == 200
    assert request(two, "GET", shadow)[0] == 404


def test_a_killed_worker_is_restarted_and_the_other_streams_go_on(two: Served) -> None:
    served = two
    served.wait_for(lambda: all_processing(served), 60, "every stream to process")
    placed = assign(STREAMS, 2)
    victim = served.json("/ready")["workers"][0]["pid"]
    mine = [s for s, w in placed.items() if w == 0]
    others = [s for s, w in placed.items() if w == 1]
    before = {s: running(served)[s]["frames_processed"] for s in others}
    os.kill(victim, signal.SIGKILL)
    # While it is down (a 0.5 s backoff, then a fresh process's start: seconds), its
    # stream answers 503 `unavailable`, its read and its latest result in the same round
    # of requests, while the other worker's streams answer 200. Every answer is checked:
    # before the gateway sees the death, the dead worker's may still be 200, never else.
    seen: list[tuple[bool, str, int, bytes]] = []  # (the dead worker's?, path, answer)

    def down() -> bool:
        paths = [(True, f"/v1/streams/{mine[0]}"), (True, f"/v1/streams/{mine[0]}/latest")]
        paths += [(False, f"/v1/streams/{s}") for s in others]
        answers = [(dead, path, *served.get(path)) for dead, path in paths]
        seen.extend(answers)
        return all(status == 503 for dead, _, status, _ in answers if dead)

    served.wait_for(down, 10, "503s for the dead worker's stream")
    for dead, path, status, body in seen:
        assert status in ((200, 503) if dead else (200,)), (path, status, body)
        if status == 503:
            assert json.loads(body)["error"]["code"] == "unavailable", (path, body)

    def back() -> bool:
        workers = served.json("/ready")["workers"]
        return (
            workers[0]["restarts"] == 1 and workers[0]["pid"] != victim and all_processing(served)
        )

    served.wait_for(back, 30, "worker 0 to be started again")
    after = running(served)
    assert all(after[s]["frames_processed"] > before[s] for s in others)
    assert after[mine[0]]["state"] == "running"
    assert 'appliance_worker_restarts_total{worker="0"} 1.0' in served.get("/metrics")[1].decode()
    assert "worker 0 exited (signal SIGKILL)" in served.log_path.read_text()


def test_a_reload_one_worker_refuses_changes_nothing_then_a_good_one_reaches_every_worker(
    two: Served, two_folder: Path
) -> None:
    """Two phases: each worker checks its share, and applies only once all accept. A
    broken workflow for a stream of worker 1 leaves worker 0's new stream unstarted,
    over the API and on SIGHUP; a good file then applies in both, and a reload of three
    more cameras reaches every worker. Last, SIGTERM stops them all (it ends `two`)."""
    served, config, doc = two, two_folder / "config.yaml", config_doc(two_folder)
    assert set(running(served)) == set(STREAMS)  # as `two` was started
    placed = assign([*STREAMS, "cam-good", "cam-bad"], 2)
    assert placed["cam-good"] != placed["cam-bad"]  # one new stream on each worker
    broken = {**detect_workflow(), "outputs": {"people": "ghost"}}
    good, bad = doc["streams"][0] | {"id": "cam-good"}, doc["streams"][0] | {"id": "cam-bad"}
    doc["streams"] += [good, {**bad, "workflow": broken}]
    config.write_text(json.dumps(doc))
    status, body = request(served, "POST", "/v1/config/reload")
    assert status == 422, body
    assert any("unknown block 'ghost'" in d for d in body["error"]["details"]), body
    assert set(running(served)) == set(STREAMS)  # cam-good not started on its worker
    mark = len(served.log_path.read_text())
    served.process.send_signal(signal.SIGHUP)
    refused = "config reload (SIGHUP) refused, nothing changed"
    served.wait_for(lambda: refused in served.log_path.read_text()[mark:], 30, "the refusal logged")
    assert set(running(served)) == set(STREAMS)
    doc["streams"][-1] = bad  # fixed
    config.write_text(json.dumps(doc))
    served.process.send_signal(signal.SIGHUP)
    served.wait_for(lambda: set(running(served)) == {*STREAMS, "cam-good", "cam-bad"}, 30,
                    "both new streams, each on its worker")  # fmt: skip
    assert {i: s["worker"] for i, s in running(served).items()} == placed
    # Three more cameras in the file: each worker starts its share of them.
    first = [*STREAMS, "cam-good", "cam-bad"]
    more = ["cam-d", "cam-e", "cam-f"]
    doc["streams"] += [{**doc["streams"][0], "id": s} for s in more]
    config.write_text(json.dumps(doc))
    status, body = request(served, "POST", "/v1/config/reload")
    assert status == 200, body
    before, after = assign(first, 2), assign([*first, *more], 2)
    moved = sorted(s for s in first if before[s] != after[s])  # the balance may move some
    assert body["added"] == more
    assert body["removed"] == []
    assert body["restarted"] == moved
    assert body["unchanged"] == sorted(set(first) - set(moved))
    assert {i: s["worker"] for i, s in running(served).items()} == after
    served.wait_for(lambda: served.get("/ready")[0] == 200, 30, "the new streams running")

    pids = [w["pid"] for w in served.json("/ready")["workers"]]
    asked = time.monotonic()
    assert served.terminate(timeout=15) == 0
    assert time.monotonic() - asked < 3 + 2 + 1  # drain_timeout_s + EXIT_MARGIN_S + slack
    for pid in pids:
        assert not Path(f"/proc/{pid}").exists() or "zombie" in _state(pid)
    assert served.log_path.read_text().count("runtime stopped") == 2
    # Each worker wrote its rolling traces in its own folder: no two writers share one.
    assert sorted(p.name for p in (two_folder / "traces").iterdir()) == ["worker-0", "worker-1"]


def _state(pid: int) -> str:
    return Path(f"/proc/{pid}/status").read_text().split("State:")[1].split("\n")[0].lower()
