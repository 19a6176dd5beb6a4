"""A stream's results and states reach a real mosquitto through the runtime's outputs,
and commands over MQTT (restart a stream, start a profiling window) go through the
runtime; a bad command is refused with a reply and changes nothing."""

from __future__ import annotations

import json
import re
import time
from collections import Counter
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path
from typing import Any, cast

import pytest

from appliance.config import parse_config, sink_configs
from appliance.errors import FileAccessError, NoShadowError
from appliance.runtime.runtime import Runtime
from appliance.runtime.shadow import ShadowSpec
from appliance.runtime.sharding import assign
from sinks.mqtt.sink import MqttSink
from tests.sinks.conftest import Broker, Received, Subscriber
from tests.support import tracecheck
from tests.support.appliance import DEMO_CLIP, Served, detect_workflow, person_model

WAIT_S = 30.0
MakeSubscriber = Callable[..., Subscriber]


@pytest.fixture
def runtime(mosquitto: Broker, tmp_path: Path) -> Iterator[Runtime]:
    bus = {"type": "mqtt", "port": mosquitto.port, "qos": 1, "topic_prefix": "site",
           "client_id": "appliance-test", "commands": {"enabled": True}}  # fmt: skip
    doc = {
        "models": {"person": person_model()},
        "sinks": {"bus": bus},
        "streams": [{"id": "cam", "workflow": detect_workflow(), "outputs": ["bus"],
                     "source": {"url": str(DEMO_CLIP), "loop": True, "pace": "realtime"}}],
        "profiling": {"dir": str(tmp_path / "traces"), "max_window_s": 5},
    }  # fmt: skip
    rt = Runtime(parse_config(doc, tmp_path))
    rt.start()
    yield rt
    rt.stop()


def payloads(messages: list[Received], topic: str) -> list[dict[str, Any]]:
    return [json.loads(m.payload) for m in messages if m.topic == topic]


def test_results_and_states_are_published(
    runtime: Runtime, mosquitto: Broker, subscriber: MakeSubscriber
) -> None:
    sub = subscriber(mosquitto, "site/#")
    got = sub.wait_for(lambda ms: len(payloads(ms, "site/cam/predictions")) >= 10, WAIT_S)
    predictions = payloads(got, "site/cam/predictions")
    seqs = [p["seq"] for p in predictions]
    assert seqs == sorted(seqs) and {p["stream"] for p in predictions} == {"cam"}
    assert set(predictions[0]["outputs"]) == {"people"}
    states = [p["state"] for p in payloads(got, "site/cam/status")]
    assert states[-1] == "running"
    # Retained: a subscriber that comes later gets the state and `online` at once.
    late = subscriber(mosquitto, "site/status", "site/cam/status")
    kept = late.wait_for(lambda ms: len(ms) >= 2, WAIT_S)
    assert all(m.retain for m in kept)
    assert {m.topic: m.payload for m in kept}["site/status"] == b"online"
    assert json.loads({m.topic: m.payload for m in kept}["site/cam/status"])["state"] == "running"
    (sink,) = runtime.sinks_status()
    assert (sink.name, sink.state, sink.up) == ("bus", "connected", True)
    assert sink.extra["broker"] == f"127.0.0.1:{mosquitto.port}"
    status = runtime.stream_status("cam")
    assert (status.outputs, status.sinks) == (["bus"], {"bus": "connected"})
    assert [s.name for s in runtime.status().sinks] == ["bus"]
    # A published frame's trace shows its delivery: publish to PUBACK, on the sink's track.
    seq = seqs[-3]
    doc = runtime.frame_trace("cam", seq).doc
    tracecheck.check(doc)
    delivered = [e for e in doc["traceEvents"] if e["name"] == "deliver"]
    assert {"sink": "bus", "stream": "cam", "seq": seq} in [e["args"] for e in delivered]
    (run,) = [e for e in doc["traceEvents"] if e["name"] == "workflow.run"
              and e["args"]["seq"] == seq]  # fmt: skip
    mine = [e for e in delivered if e["args"]["seq"] == seq]
    assert mine[0]["ts"] >= run["ts"] + run["dur"]  # published once the frame was done


def test_commands_restart_a_stream_and_start_a_window(
    runtime: Runtime, mosquitto: Broker, subscriber: MakeSubscriber
) -> None:
    sub = subscriber(mosquitto, "site/cmd/reply")
    before = runtime.streams["cam"]
    sub.publish("site/cmd/streams/cam/restart", json.dumps({"id": "r1"}).encode())
    sub.publish("site/cmd/profiling", json.dumps({"id": "r2", "duration_s": 0.5}).encode())
    sub.publish("site/cmd/streams/nope/restart", json.dumps({"id": "r3"}).encode())
    sub.publish("site/cmd/profiling", b"{not json")
    got = sub.wait_for(lambda ms: len(ms) >= 4, WAIT_S)
    replies = {r.get("id"): r for r in (json.loads(m.payload) for m in got)}
    assert replies["r1"]["ok"] and replies["r1"]["result"]["stream"] == "cam"
    assert runtime.streams["cam"] is not before  # restarted, through the runtime
    assert replies["r2"]["ok"] and replies["r2"]["result"]["state"] == "running"
    assert runtime.profiling_window(replies["r2"]["result"]["id"]).duration_s == 0.5
    assert not replies["r3"]["ok"] and "nope" in replies["r3"]["error"]
    bad = [r for r in replies.values() if r.get("id") is None]
    assert len(bad) == 1 and not bad[0]["ok"]


def test_a_shadow_is_stopped_and_a_rollback_refused_over_mqtt(
    runtime: Runtime, mosquitto: Broker, subscriber: MakeSubscriber
) -> None:
    runtime.shadows.start("cam", ShadowSpec(workflow=detect_workflow(), max_live_cost=1.0))
    sub = subscriber(mosquitto, "site/cmd/reply")
    sub.publish("site/cmd/streams/cam/shadow/stop", json.dumps({"id": "s1"}).encode())
    sub.publish("site/cmd/streams/cam/shadow/rollback", json.dumps({"id": "s2"}).encode())
    sub.publish("site/cmd/streams/cam/shadow/stop", json.dumps({"id": "s3"}).encode())
    got = sub.wait_for(lambda ms: len(ms) >= 3, WAIT_S)
    replies = {r.get("id"): r for r in (json.loads(m.payload) for m in got)}
    assert replies["s1"]["ok"], replies["s1"]
    stopped = replies["s1"]["result"]
    assert (stopped["stream"], stopped["running"]) == ("cam", False)
    assert not replies["s2"]["ok"] and "no promotion to roll back" in replies["s2"]["error"]
    assert not replies["s3"]["ok"] and "runs no shadow" in replies["s3"]["error"]
    with pytest.raises(NoShadowError):
        runtime.shadows.find("cam")
    actions = [(e.action, e.outcome) for e in runtime.audit.recent() if e.who == "mqtt"]
    assert ("shadow.stop", "ok") in actions and ("shadow.rollback", "refused") in actions


def test_tls_files_go_through_the_file_policy(tmp_path: Path) -> None:
    bus = {"type": "mqtt", "port": 1, "tls": {"ca_file": "/dev/zero"}}
    stream = {"id": "cam", "workflow": detect_workflow(), "outputs": ["bus"],
              "source": {"url": str(DEMO_CLIP)}}  # fmt: skip
    doc = {"models": {"person": person_model()}, "sinks": {"bus": bus}, "streams": [stream]}
    rt = Runtime(parse_config(doc, tmp_path))
    try:
        with pytest.raises(FileAccessError, match=r"sinks.bus.tls.ca_file: .*not a regular"):
            rt.start()
        assert rt.streams == {}  # refused before any stream started
    finally:
        rt.stop()
    (tmp_path / "ca.pem").write_text("-----BEGIN CERTIFICATE-----\n")
    bus["tls"] = {"ca_file": "ca.pem"}  # relative to the config, like every path in it
    rt = Runtime(parse_config(doc, tmp_path))
    sink = rt.outputs._build("bus", sink_configs(rt.config)["bus"])  # built, not started
    assert isinstance(sink, MqttSink) and sink.config.tls is not None
    assert sink.config.tls.ca_file == tmp_path / "ca.pem"


def test_a_password_file_is_read_through_the_file_policy(start_broker: Any, tmp_path: Path) -> None:
    """`password_file` (a mounted secret): read at start through the file policy, its
    trailing newline dropped; the sink connects with it and shows it nowhere. A file
    that is not a small regular file is refused, naming the field."""
    from appliance.errors import FileAccessError, LimitError

    broker: Broker = start_broker(users={"cam": "right-password"})
    (tmp_path / "mqtt-password").write_text("right-password\n")
    bus = {"type": "mqtt", "port": broker.port, "username": "cam",
           "password_file": "mqtt-password", "client_id": "appliance-pwfile"}  # fmt: skip
    doc = {"models": {"person": person_model()}, "sinks": {"bus": bus}, "streams": []}
    rt = Runtime(parse_config(doc, tmp_path))
    rt.start()
    try:
        deadline = time.monotonic() + WAIT_S
        while not rt.sinks_status()[0].up and time.monotonic() < deadline:
            time.sleep(0.05)
        status = rt.sinks_status()[0]
        assert status.up, status
        assert "right-password" not in repr(status)
    finally:
        rt.stop()
    (tmp_path / "huge").write_text("x" * 10_000)  # over limits: a password is small
    for name, refused in (("huge", LimitError), (".", FileAccessError)):
        rt = Runtime(parse_config({**doc, "sinks": {"bus": dict(bus, password_file=name)}},
                                  tmp_path))  # fmt: skip
        with pytest.raises(refused, match=r"password_file|secret"):
            rt.start()
        rt.stop()


CONNECTED = re.compile(r"New client connected from \S+ as (\S+) ")


def _connected_after(broker: Broker, count: int, start: int = 0) -> int:
    """Wait for `count` more `New client connected` lines in the broker's log from line
    `start` on; the index after the last of them."""
    assert broker.log is not None
    at = start
    for _ in range(count):
        assert broker.log.wait_for(CONNECTED.pattern, at), broker.log.lines
        lines = enumerate(broker.log.lines)
        at = 1 + next(i for i, line in lines if i >= at and CONNECTED.search(line))
    return at


def test_two_workers_keep_their_own_broker_sessions(
    mosquitto: Broker, subscriber: MakeSubscriber, tmp_path: Path
) -> None:
    """`serve --workers 2`: both processes' MQTT sinks share one config (one client id);
    each connects as `<id>-w<N>`, so the broker does not drop one for the other.

    The broker's log says so: a client that connects with an id already connected makes
    mosquitto close the older connection ("already connected") before it logs the new
    one, so once both sinks' connections are in the log, and a later client's after
    them, a takeover would be there too."""
    bus = {"type": "mqtt", "port": mosquitto.port, "client_id": "appliance-test"}
    doc = {"sinks": {"bus": bus}, "profiling": {"dir": str(tmp_path / "traces")}}
    workers = [Runtime(parse_config(doc, tmp_path), worker=i) for i in (0, 1)]
    for rt in workers:
        rt.start()
    try:
        sinks = [cast(MqttSink, rt.outputs.sinks["bus"]) for rt in workers]
        assert [s.config.client_id for s in sinks] == ["appliance-test-w0", "appliance-test-w1"]
        seen = _connected_after(mosquitto, 2)  # both sinks
        subscriber(mosquitto, "site/#")  # connected after both: the log holds theirs
        _connected_after(mosquitto, 1, seen)
        assert mosquitto.log is not None
        lines = list(mosquitto.log.lines)
        assert not [line for line in lines if "already connected" in line], lines
        ids = Counter(m[1] for line in lines if (m := CONNECTED.search(line)))
        assert ids["appliance-test-w0"] == ids["appliance-test-w1"] == 1, ids  # no reconnect
        deadline = time.monotonic() + WAIT_S
        while not all(s.status().up for s in sinks) and time.monotonic() < deadline:
            time.sleep(0.01)  # paho's thread reports the CONNACK a moment after the log
        assert [s.status().state for s in sinks] == ["connected", "connected"]
        assert all(s.status().last_error is None for s in sinks)
    finally:
        for rt in workers:
            rt.stop()


def test_with_workers_each_command_is_answered_once(
    mosquitto: Broker, subscriber: MakeSubscriber, tmp_path: Path, serve: Callable[..., Served]
) -> None:
    """`serve --workers 2`: a restart is done by the stream's worker, a profiling window
    covers every worker, and each command gets one answer (worker 0 alone listens, and
    hands the command to the gateway), as one process would give.

    "One": after the answers, a last command (`fence`) goes the same way; its answer
    comes from the same client on the same topic at the same QoS, so whatever that
    client published before it has arrived before it (MQTT keeps that order). Another
    worker would be another client, which no fence orders: that no other worker's sink
    takes commands at all is read from /v1/sinks."""
    bus = {"type": "mqtt", "port": mosquitto.port, "qos": 1, "topic_prefix": "site",
           "client_id": "appliance-test", "commands": {"enabled": True}}  # fmt: skip
    ids = ["cam-a", "cam-b", "cam-c"]
    placed = assign(ids, 2)
    assert set(placed.values()) == {0, 1}  # a stream on each worker: the test means it
    doc = {
        "models": {"person": person_model()},
        "sinks": {"bus": bus},
        "streams": [{"id": i, "workflow": detect_workflow(), "outputs": ["bus"],
                     "source": {"url": str(DEMO_CLIP), "pace": "realtime"}} for i in ids],
        "profiling": {"dir": str(tmp_path / "traces"), "max_window_s": 5},
    }  # fmt: skip
    config = tmp_path / "config.yaml"
    config.write_text(json.dumps(doc))
    served = serve(config, "--workers", "2")
    served.wait_for(lambda: served.get("/ready")[0] == 200, 60, "every stream running")
    sub = subscriber(mosquitto, "site/cmd/reply")
    started = {i: _started(served, i) for i in ids}
    for i in ids:
        sub.publish(f"site/cmd/streams/{i}/restart", json.dumps({"id": i}).encode())
    sub.publish("site/cmd/streams/nope/restart", json.dumps({"id": "nope"}).encode())
    sub.publish("site/cmd/profiling", json.dumps({"id": "window", "duration_s": 0.5}).encode())
    sub.wait_for(lambda ms: len(ms) >= len(ids) + 2, WAIT_S)
    sub.publish("site/cmd/streams/fence/restart", json.dumps({"id": "fence"}).encode())
    sub.wait_for(lambda ms: any(json.loads(m.payload)["id"] == "fence" for m in ms), WAIT_S)
    replies = [json.loads(m.payload) for m in sub.messages]
    assert sorted(r["id"] for r in replies) == sorted([*ids, "nope", "window", "fence"]), replies
    sinks = served.json("/v1/sinks")["sinks"]
    taking = {s["worker"]: s["extra"]["commands_refused"] for s in sinks
              if "commands_refused" in s["extra"]}  # fmt: skip
    assert taking == {0: 2}, sinks  # worker 0 alone, which refused "nope" and "fence"
    by_id = {r["id"]: r for r in replies}
    for i in ids:  # restarted where it runs, whichever worker that is
        assert by_id[i]["ok"] and by_id[i]["result"]["stream"] == i, by_id[i]
        served.wait_for(partial(_restarted, served, i, started[i]), 10, f"{i} restarted")
    assert not by_id["nope"]["ok"] and by_id["nope"]["error"] == "unknown stream 'nope'"
    window = by_id["window"]["result"]
    assert by_id["window"]["ok"] and window["duration_s"] == 0.5
    # One window, the gateway's: its id is known where the merged trace is served.
    served.wait_for(lambda: served.json(f"/v1/profiling/{window['id']}")["state"] == "done",
                    15, "the window to end")  # fmt: skip


def _restarted(served: Served, stream_id: str, first: float) -> bool:
    return _started(served, stream_id) > first


def _started(served: Served, stream_id: str) -> float:
    """When the stream (this instance of it: a restart makes a new one) started."""
    return float(served.json(f"/v1/streams/{stream_id}")["transitions"][0]["time"])
