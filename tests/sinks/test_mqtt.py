"""The MQTT sink against a real mosquitto: what is published (schema, order, retained
status, Last Will), broker outages and the offline queue, a broker that is not there,
refused credentials and TLS, and commands. The sink runs on its own loop thread; the test
thread plays the stream worker that calls `offer`."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import paho.mqtt.client as mqtt
import pytest
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties
from pydantic import ValidationError

from pipelines.types import Detections, FrameResult
from sinks.mqtt.config import MqttConfig
from sinks.mqtt.sink import MqttSink
from tests.sinks.conftest import WAIT_S, Broker, LogWatch, Received, SinkLoop, Subscriber

ROOT = Path(__file__).resolve().parents[2]
PASSWORD = "hunter2-wrong"
FAST = {"initial_s": 0.1, "max_s": 0.5}  # reconnect backoff for tests, seconds


def config(broker: Broker, **over: Any) -> MqttConfig:
    doc: dict[str, Any] = {
        "type": "mqtt",
        "port": broker.port,
        "topic_prefix": "t",
        "client_id": "sink-under-test",
        "reconnect": FAST,
        **over,
    }
    return MqttConfig.model_validate(doc)


def result(seq: int, stream: str = "cam", counts: dict[str, int] | None = None) -> FrameResult:
    people = Detections.from_arrays([[10, 20, 30, 60]], [0.875], [0], labels=["person"])
    tracked = Detections(
        people.xyxy, people.confidence, people.class_id, people.class_name, np.array([7])
    )
    outputs: dict[str, Any] = {"people": tracked, "image": np.zeros((4, 4, 3), np.uint8)}
    if counts is not None:
        outputs["door"] = counts
    return FrameResult(
        stream,
        seq,
        seq / 25,
        1_700_000_000.0 + seq,
        10.0,
        10.0,
        10.02,
        np.zeros((4, 4, 3), np.uint8),
        outputs,
        version="3f9a1c0e7b2d",
    )


def seqs(messages: list[Received], topic: str = "t/cam/predictions") -> list[int]:
    return [json.loads(m.payload)["seq"] for m in messages if m.topic == topic]


def has_seqs(want: list[int], topic: str = "t/cam/predictions") -> Any:
    return lambda msgs: set(want) <= set(seqs(msgs, topic))


def test_predictions_events_and_status_in_order_at_qos1(
    mosquitto: Broker, subscriber: Any, sink_loop: SinkLoop
) -> None:
    sub: Subscriber = subscriber(mosquitto, "t/#")
    sink = sink_loop.start(MqttSink("bus", config(mosquitto)))
    for seq in range(60):
        assert sink.offer(result(seq, counts={"in": seq // 20, "out": 0, "total": seq // 20}))
    msgs = sub.wait_for(has_seqs(list(range(60))))
    assert seqs(msgs) == list(range(60))  # in order, none twice (no reconnect here)
    first = json.loads(next(m.payload for m in msgs if m.topic == "t/cam/predictions"))
    assert first == {
        "v": 1,
        "stream": "cam",
        "seq": 0,
        "capture_time": 1_700_000_000.0,
        "captured_at": "2023-11-14T22:13:20.000Z",
        "latency_ms": 20.0,
        "workflow": "3f9a1c0e7b2d",
        "outputs": {
            "people": [
                {
                    "box": [10.0, 20.0, 30.0, 60.0],
                    "confidence": 0.875,
                    "class_id": 0,
                    "class": "person",
                    "track_id": 7,
                }
            ],
            "door": {"in": 0, "out": 0, "total": 0},
        },
    }
    sub.wait_for(lambda m: len(seqs(m, "t/cam/events")) >= 3)
    events = [json.loads(m.payload) for m in sub.on("t/cam/events")]
    kinds = [(e["type"], e["seq"]) for e in events]
    assert kinds[:3] == [("class_appeared", 0), ("line_crossed", 20), ("line_crossed", 40)]
    assert [(m.payload, m.retain) for m in sub.on("t/status")] == [(b"online", False)]
    sink.publish_stream_status("cam", "running", None)
    status = sub.wait_for(lambda m: any(x.topic == "t/cam/status" for x in m))
    body = json.loads(next(m.payload for m in status if m.topic == "t/cam/status"))
    assert (body["stream"], body["state"], body["reason"]) == ("cam", "running", None)
    # `time` for programs, `at` for people: the same instant.
    assert datetime.fromisoformat(body["at"]).timestamp() == pytest.approx(body["time"], abs=1e-3)
    assert body["at"].endswith("Z")
    st = sink.status()
    assert (st.state, st.up, st.dropped, st.last_error) == ("connected", True, 0, None)

    sink_loop.stop(sink)  # a clean stop says "offline" itself (no Last Will on DISCONNECT)
    late: Subscriber = subscriber(mosquitto, "t/status", "t/cam/status")
    retained = late.wait_for(lambda m: len(m) >= 2)
    assert {(m.topic, m.retain) for m in retained} == {("t/status", True), ("t/cam/status", True)}
    assert late.on("t/status")[0].payload == b"offline"
    st = sink.status()
    assert (st.state, st.queue_depth, st.dropped) == ("stopped", 0, 0)  # drained at stop
    assert st.sent >= 60 + 3 + 1 + 2  # predictions, events, stream status, online/offline
    assert not sink.offer(result(99))


CHILD = """
import asyncio, sys
from sinks.mqtt.sink import MqttSink
from sinks.mqtt.config import MqttConfig

async def main() -> None:
    cfg = MqttConfig(type="mqtt", port=int(sys.argv[1]), topic_prefix="t", client_id="child")
    await MqttSink("bus", cfg).start()
    await asyncio.Event().wait()  # until killed

asyncio.run(main())
"""


def test_last_will_offline_when_the_process_dies(mosquitto: Broker, subscriber: Any) -> None:
    sub: Subscriber = subscriber(mosquitto, "t/status")
    child = subprocess.Popen([sys.executable, "-c", CHILD, str(mosquitto.port)], cwd=ROOT)
    try:
        sub.wait_for(lambda m: [x.payload for x in m] == [b"online"])
    finally:
        os.kill(child.pid, signal.SIGKILL)  # no DISCONNECT: the broker sends the Will
        child.wait(10)
    sub.wait_for(lambda m: [x.payload for x in m] == [b"online", b"offline"])
    late: Subscriber = subscriber(mosquitto, "t/status")
    assert late.wait_for(lambda m: len(m) == 1)[0] == Received("t/status", b"offline", True, None)


def outage(broker: Broker, sink_log: LogWatch) -> None:
    """Stop the broker and wait until the sink has noticed."""
    mark = len(sink_log.records)
    broker.stop()
    sink_log.wait_for("reconnecting", start=mark)


def test_outage_queues_then_delivers_in_order(
    mosquitto: Broker, subscriber: Any, sink_loop: SinkLoop, sink_log: LogWatch
) -> None:
    sub: Subscriber = subscriber(mosquitto, "t/cam/predictions")
    sink = sink_loop.start(MqttSink("bus", config(mosquitto)))
    for seq in range(20):
        sink.offer(result(seq))
    sub.wait_for(has_seqs(list(range(20))))
    outage(mosquitto, sink_log)
    # Workers can offer faster than the loop runs: hold the loop while 100 arrive, so
    # the delivery task wakes to a full queue, takes the oldest, finds no connection
    # and must give it back first in line.
    gate = threading.Event()
    sink_loop.thread.loop.call_soon_threadsafe(gate.wait, WAIT_S)
    try:
        for seq in range(20, 120):  # offered while the broker is away: never blocks
            assert sink.offer(result(seq))
    finally:
        gate.set()
    assert sink.status().queue_depth >= 100
    mark = len(sink_log.records)
    mosquitto.start()  # the same port
    sink_log.wait_for("connected", start=mark)
    msgs = sub.wait_for(has_seqs(list(range(120))))
    got = seqs(msgs)
    deduped = [s for i, s in enumerate(got) if s not in got[:i]]  # QoS 1 may repeat one
    assert deduped == list(range(120))
    assert sink.status().dropped == 0


def test_outage_mid_burst_loses_nothing_in_flight(
    mosquitto: Broker, subscriber: Any, sink_loop: SinkLoop, sink_log: LogWatch
) -> None:
    # The broker goes while publishes are in flight: paho keeps those unacknowledged and
    # sends them again first after the reconnect; nothing new goes out before them.
    sub: Subscriber = subscriber(mosquitto, "t/cam/predictions")
    sink = sink_loop.start(MqttSink("bus", config(mosquitto)))
    for seq in range(300):
        sink.offer(result(seq))
    outage(mosquitto, sink_log)
    for seq in range(300, 400):
        sink.offer(result(seq))
    mosquitto.start()
    got = seqs(sub.wait_for(has_seqs(list(range(400)))))
    assert [s for i, s in enumerate(got) if s not in got[:i]] == list(range(400))


def test_offline_queue_overflow_drops_the_oldest(
    mosquitto: Broker, subscriber: Any, sink_loop: SinkLoop, sink_log: LogWatch
) -> None:
    sub: Subscriber = subscriber(mosquitto, "t/cam/predictions")
    cfg = config(mosquitto, queue={"max_messages": 5})
    sink = sink_loop.start(MqttSink("bus", cfg))
    sink.offer(result(0))
    sub.wait_for(has_seqs([0]))
    outage(mosquitto, sink_log)
    gate = threading.Event()  # the loop held: no message is out of the queue meanwhile
    sink_loop.thread.loop.call_soon_threadsafe(gate.wait, WAIT_S)
    try:
        for seq in range(1, 21):
            sink.offer(result(seq))
        assert sink.status().dropped == 15
    finally:
        gate.set()
    mosquitto.start()
    msgs = sub.wait_for(has_seqs([0, *range(16, 21)]))
    assert sorted(set(seqs(msgs))) == [0, 16, 17, 18, 19, 20]  # 1..15, the oldest, dropped


def test_broker_unreachable_at_start_then_up(
    start_broker: Any, subscriber: Any, sink_loop: SinkLoop, sink_log: LogWatch
) -> None:
    broker: Broker = start_broker(run=False)
    sink = sink_loop.start(MqttSink("bus", config(broker)))  # returns: it keeps trying
    sink_log.wait_for("reconnecting")
    st = sink.status()
    assert (st.state, st.up) == ("reconnecting", False)
    assert st.last_error is not None and f"cannot reach 127.0.0.1:{broker.port}" in st.last_error
    assert sink.offer(result(0))
    sink.publish_stream_status("cam", "connecting", "camera not answering")
    broker.start()
    sink_log.wait_for("connected")
    sub: Subscriber = subscriber(broker, "t/cam/status", "t/status")
    msgs = sub.wait_for(lambda m: len(m) >= 2)  # both retained: whenever one subscribes
    body = json.loads(next(m.payload for m in msgs if m.topic == "t/cam/status"))
    assert (body["state"], body["reason"]) == ("connecting", "camera not answering")
    assert [m.payload for m in msgs if m.topic == "t/status"] == [b"online"]
    assert sink.status().state == "connected"


def test_qos0_drops_and_counts_while_disconnected(
    start_broker: Any, sink_loop: SinkLoop, sink_log: LogWatch
) -> None:
    broker: Broker = start_broker(run=False)
    sink = sink_loop.start(MqttSink("bus", config(broker, qos=0)))
    sink_log.wait_for("reconnecting")
    assert sink.offer(result(0)) and sink.offer(result(1))
    st = sink.status()
    assert (st.dropped, st.queue_depth) == (3, 0)  # 2 predictions, 1 class_appeared


@pytest.mark.parametrize("protocol", ["5", "3.1.1"])
def test_wrong_password_is_clear_masked_and_backs_off(
    start_broker: Any, sink_loop: SinkLoop, sink_log: LogWatch, protocol: str
) -> None:
    broker: Broker = start_broker(users={"cam": "right-password"})
    reconnect = {"initial_s": 0.5, "max_s": 30.0}
    cfg = config(broker, username="cam", password=PASSWORD, protocol=protocol, reconnect=reconnect)
    assert PASSWORD not in repr(cfg) and PASSWORD not in cfg.model_dump_json()
    sink = sink_loop.start(MqttSink("bus", cfg))
    sink_log.wait_for("auth_failed")
    st = sink.status()
    assert st.state == "auth_failed" and not st.up
    assert st.last_error in (
        "broker refused the connection: Not authorized",
        "broker refused the connection: Bad user name or password",
    )
    before = st.extra["connect_attempts"]
    time.sleep(2.0)  # measuring a retry rate over a window, not waiting for an event
    retries = sink.status().extra["connect_attempts"] - before
    assert 1 <= retries <= 3  # 0.5 s, then 1 s, 2 s, ...: retrying, and no tight loop
    assert sum("auth_failed" in r for r in sink_log.records) == 1  # said once, not per retry
    assert all(PASSWORD not in r for r in sink_log.records)


def test_right_password_connects(
    start_broker: Any, sink_loop: SinkLoop, sink_log: LogWatch
) -> None:
    broker: Broker = start_broker(users={"cam": "right-password"})
    cfg = config(broker, username="cam", password="right-password")
    sink = sink_loop.start(MqttSink("bus", cfg))
    sink_log.wait_for("connected")
    assert sink.status().up


# paho leaves the socket of a failed TLS handshake to the garbage collector
# (client.py `_ssl_wrap_socket`), which warns; the sink never holds that socket.
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
def test_untrusted_certificate_is_a_tls_failure(
    start_broker: Any, sink_loop: SinkLoop, sink_log: LogWatch
) -> None:
    broker: Broker = start_broker(tls=True)
    sink = sink_loop.start(MqttSink("bus", config(broker, tls={})))  # system CAs only
    sink_log.wait_for("tls_failed")
    st = sink.status()
    assert st.state == "tls_failed" and st.last_error is not None
    assert st.last_error.startswith("TLS: ") and "certificate verify failed" in st.last_error


def test_tls_with_its_ca_connects(
    start_broker: Any, sink_loop: SinkLoop, sink_log: LogWatch
) -> None:
    broker: Broker = start_broker(tls=True)
    sink = sink_loop.start(MqttSink("bus", config(broker, tls={"ca_file": broker.cert})))
    sink_log.wait_for("connected")
    assert sink.status().up


@pytest.mark.parametrize("prefix", ["", "a/", "/a", "a//b", "a/+", "a/#"])
def test_topic_prefix_is_a_plain_topic(prefix: str) -> None:
    with pytest.raises(ValidationError, match="topic_prefix"):
        MqttConfig.model_validate({"type": "mqtt", "topic_prefix": prefix})


class Handler:
    """The runtime's control interface, as far as commands go: records each call."""

    # The topics it takes, as the appliance's catalogue gives them (appliance/runtime/commands.py).
    topics = {"cmd/streams/{stream}/restart": "restart", "cmd/profiling": "profiling"}

    def __init__(self) -> None:
        self.calls: list[tuple[str, dict[str, Any]]] = []

    async def __call__(self, command: str, args: dict[str, Any]) -> dict[str, Any]:
        self.calls.append((command, args))
        if command == "restart" and args["stream"] != "cam":
            raise KeyError(f"unknown stream {args['stream']!r}")
        return {"done": command}


def commands_sink(broker: Broker, sink_loop: SinkLoop, sink_log: LogWatch) -> Handler:
    handler = Handler()
    cfg = config(broker, commands={"enabled": True, "max_payload_bytes": 256})
    sink_loop.start(MqttSink("bus", cfg, on_command=handler))
    sink_log.wait_for("commands on t/cmd/#")  # subscribed: requests from now on arrive
    return handler


def test_commands_run_through_the_handler_and_bad_ones_are_refused(
    mosquitto: Broker, subscriber: Any, sink_loop: SinkLoop, sink_log: LogWatch
) -> None:
    handler = commands_sink(mosquitto, sink_loop, sink_log)
    client: Subscriber = subscriber(mosquitto, "t/cmd/reply")
    big = b'{"id": "big", "pad": "' + b"x" * 300 + b'"}'
    requests = [
        ("t/cmd/streams/cam/restart", b'{"id": "r1"}'),
        ("t/cmd/profiling", b'{"id": 2, "seconds": 5}'),
        ("t/cmd/streams/nope/restart", b'{"id": "r3"}'),
        ("t/cmd/profiling", b"{not json"),
        ("t/cmd/profiling", big),
        ("t/cmd/profiling", b"[1, 2]"),
        ("t/cmd/reboot", b'{"id": "r7"}'),
    ]
    for topic, payload in requests:
        client.publish(topic, payload)
    msgs = client.wait_for(lambda m: len(m) == len(requests))
    replies = [json.loads(m.payload) for m in msgs]
    by_id = {r.get("id"): r for r in replies}
    assert by_id["r1"] == {
        "ok": True,
        "command": "restart",
        "id": "r1",
        "result": {"done": "restart"},
    }
    assert by_id[2]["ok"] and by_id[2]["result"] == {"done": "profiling"}
    assert by_id["r3"] == {
        "ok": False,
        "command": "restart",
        "id": "r3",
        "error": "unknown stream 'nope'",
    }
    errors = sorted(r["error"] for r in replies if "id" not in r or r["id"] in ("r7",))
    assert errors[0].startswith("payload is not valid JSON")
    assert errors[1] == "payload must be a JSON object, got list"
    assert errors[2] == f"payload too large: {len(big)} bytes > 256"
    assert errors[3].startswith("unknown command topic 'cmd/reboot'")
    assert sorted(handler.calls, key=str) == [  # refused requests never reach it
        ("profiling", {"seconds": 5}),  # `id` names the request: not an argument
        ("restart", {"stream": "cam"}),
        ("restart", {"stream": "nope"}),
    ]
    assert all(m.topic == "t/cmd/reply" for m in msgs)


def test_mqtt5_reply_goes_to_the_response_topic_with_correlation(
    mosquitto: Broker, subscriber: Any, sink_loop: SinkLoop, sink_log: LogWatch
) -> None:
    commands_sink(mosquitto, sink_loop, sink_log)
    client: Subscriber = subscriber(mosquitto, "t/cmd/response/me", protocol=mqtt.MQTTv5)
    props = Properties(PacketTypes.PUBLISH)  # type: ignore[no-untyped-call]
    props.ResponseTopic = "t/cmd/response/me"
    props.CorrelationData = b"req-42"
    client.publish("t/cmd/streams/cam/restart", b"", props)
    reply = client.wait_for(lambda m: len(m) == 1)[0]
    assert json.loads(reply.payload) == {
        "ok": True,
        "command": "restart",
        "result": {"done": "restart"},
    }
    assert reply.properties.CorrelationData == b"req-42"


def test_snapshots_on_events_at_most_one_per_interval(
    mosquitto: Broker, subscriber: Any, sink_loop: SinkLoop
) -> None:
    sub: Subscriber = subscriber(mosquitto, "t/cam/snapshot", "t/cam/events")
    shots = {"enabled": True, "min_interval_s": 5.0}
    sink = sink_loop.start(MqttSink("bus", config(mosquitto, snapshots=shots)))
    frame = np.zeros((48, 64, 3), np.uint8)
    frame[:, 32:] = 255  # half white: the JPEG must carry this picture
    for seq in range(4):  # seq 0: a class appears; 1-3: the door count moves each time
        shot = result(seq, counts={"in": seq, "out": 0, "total": seq})
        shot.image, shot.done_mono = frame, 10.0 + seq  # seconds
        assert sink.offer(shot)
    # In order on one connection: once the last event is here, every snapshot is too.
    sub.wait_for(lambda m: len([x for x in m if x.topic == "t/cam/events"]) >= 4)
    (snap,) = sub.on("t/cam/snapshot")  # events at 0, 1, 2, 3 s: one per 5 s interval
    image = cv2.imdecode(np.frombuffer(snap.payload, np.uint8), cv2.IMREAD_COLOR)
    assert image is not None and image.shape == (48, 64, 3)
    assert image[:, :24].mean() < 20 and image[:, 40:].mean() > 235
    late: Subscriber = subscriber(mosquitto, "t/cam/snapshot")  # retained for late readers
    assert late.wait_for(lambda m: len(m) >= 1)[0].retain
