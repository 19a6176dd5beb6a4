"""Signed MQTT commands that must not run twice (issue 39, item 7), on a real mosquitto:
a retained command (the broker hands it to every new subscription, so to the sink each
time it connects) is refused; the signatures already used are kept in the state folder
across restarts of the sink, and without one a command signed before the sink started
is refused (it may be a replay of one an earlier process ran)."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import paho.mqtt.client as mqtt
import pytest
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from appliance.policy.files import FilePolicy
from appliance.policy.limits import LimitsConfig
from appliance.runtime.sinkstate import SinkDocument
from sinks.base import KeptDocument, SinkContext
from sinks.mqtt.sink import MqttSink
from sinks.signing import sign
from tests.sinks.conftest import Broker, LogWatch, SinkLoop, Subscriber
from tests.sinks.test_mqtt import Handler, config

SECRET = b"sink-cmd-key-31"
TOPIC = "t/cmd/streams/cam/restart"
MakeSubscriber = Callable[..., Subscriber]


def start_sink(
    broker: Broker,
    sink_loop: SinkLoop,
    sink_log: LogWatch,
    kept: KeptDocument | None = None,
    tmp_path: Path | None = None,
) -> tuple[MqttSink, Handler]:
    """A sink taking signed commands, built as the runtime builds it; subscribed."""
    commands = {"enabled": True, "auth": "hmac", "secret": SECRET.decode()}
    cfg = config(broker, client_id="replay-test", commands=commands)
    handler = Handler()
    context = SinkContext(data_dir=tmp_path or Path("."), on_command=handler, kept=kept)
    mark = len(sink_log.records)
    sink = sink_loop.start(MqttSink.build("bus", cfg, context))
    sink_log.wait_for("commands on t/cmd/#", start=mark)  # subscribed
    return sink, handler


def command(request_id: str, at: float | None = None) -> tuple[bytes, str]:
    """A restart of `cam`: its payload, and its signature made now (or at `at`)."""
    payload = json.dumps({"id": request_id}).encode()
    return payload, sign(SECRET, TOPIC, payload, at)


def publish(client: Subscriber, payload: bytes, signature: str, retain: bool = False) -> None:
    props = Properties(PacketTypes.PUBLISH)  # type: ignore[no-untyped-call]
    props.UserProperty = ("signature", signature)
    client.client.publish(TOPIC, payload, 1, retain, props).wait_for_publish(10)


def answer(client: Subscriber, request_id: str) -> dict[str, Any]:
    """The one answer to `request_id` on t/cmd/reply (waits for it)."""
    got = client.wait_for(lambda ms: any(_id(m.payload) == request_id for m in ms))
    (reply,) = [m for m in got if _id(m.payload) == request_id]
    return dict(json.loads(reply.payload))


def _id(payload: bytes) -> Any:
    return json.loads(payload).get("id")


@pytest.fixture
def client(mosquitto: Broker, subscriber: MakeSubscriber) -> Subscriber:
    return subscriber(mosquitto, "t/cmd/reply", protocol=mqtt.MQTTv5)


def documents(folder: Path) -> SinkDocument:
    """The runtime's store for sink `bus` in `folder`, as `server.state_dir` gives it."""
    return SinkDocument(folder / "sink-bus.json", FilePolicy(folder, LimitsConfig()))


# -- retained commands ------------------------------------------------------------------
def test_a_retained_command_is_refused_not_run(
    mosquitto: Broker, client: Subscriber, sink_loop: SinkLoop, sink_log: LogWatch
) -> None:
    """A signed command left retained on the broker reaches the sink when it subscribes,
    with the retain flag: refused with the reason, counted, and nothing runs."""
    publish(client, *command("kept", at=time.time() + 1), retain=True)
    sink, handler = start_sink(mosquitto, sink_loop, sink_log)
    refused = answer(client, "kept")
    assert refused["ok"] is False and refused["error"].startswith("retained: "), refused
    assert handler.calls == []
    assert sink.status().extra["commands_refused"] == 1
    # A command published as commands are (retain false) runs.
    publish(client, *command("live", at=time.time() + 1))
    assert answer(client, "live")["ok"] is True
    assert handler.calls == [("restart", {"stream": "cam"})]


# -- without a state folder: the start-time rule ----------------------------------------------
def test_without_a_kept_guard_a_command_signed_before_the_start_is_refused(
    mosquitto: Broker, client: Subscriber, sink_loop: SinkLoop, sink_log: LogWatch
) -> None:
    early = command("early", at=time.time() - 1)  # signed, then the appliance (re)started
    sink, handler = start_sink(mosquitto, sink_loop, sink_log)
    publish(client, *early)
    refused = answer(client, "early")
    assert refused["ok"] is False and refused["error"].startswith(
        "signed before this appliance started"
    ), refused
    assert "server.state_dir" in refused["error"]
    assert handler.calls == [] and sink.status().extra["commands_auth_refused"] == 1
    publish(client, *command("later", at=time.time() + 1))  # signed after the start
    assert answer(client, "later")["ok"] is True


# -- with a state folder: the guard kept across restarts ---------------------------------------
def test_the_used_signatures_survive_a_restart_of_the_sink(
    mosquitto: Broker,
    client: Subscriber,
    sink_loop: SinkLoop,
    sink_log: LogWatch,
    tmp_path: Path,
) -> None:
    state = tmp_path / "state"
    first, handler = start_sink(mosquitto, sink_loop, sink_log, documents(state))
    ran = command("ran", at=time.time() + 1)
    publish(client, *ran)
    assert answer(client, "ran")["ok"] is True
    kept = state / "sink-bus.json"
    assert kept.stat().st_mode & 0o777 == 0o600
    unsent = command("unsent", at=time.time() + 1)  # signed now, sent after the restart
    sink_loop.stop(first)

    second, handler = start_sink(mosquitto, sink_loop, sink_log, documents(state))
    client.messages.clear()
    publish(client, *ran)  # the very same message: payload and signature
    replayed = answer(client, "ran")
    assert replayed["ok"] is False and replayed["error"].startswith("replayed: "), replayed
    # Signed before this start but never used: the kept guard vouches for it.
    publish(client, *unsent)
    assert answer(client, "unsent")["ok"] is True
    assert handler.calls == [("restart", {"stream": "cam"})]
    assert second.status().extra["commands_auth_refused"] == 1


def test_a_kept_guard_that_does_not_validate_is_set_aside_and_the_start_rule_holds(
    mosquitto: Broker,
    client: Subscriber,
    sink_loop: SinkLoop,
    sink_log: LogWatch,
    tmp_path: Path,
) -> None:
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    kept = state / "sink-bus.json"
    kept.write_text('{"format": "appliance-state", "kind": "sink", "version": 1, "used": 7}')
    early = command("early", at=time.time() - 1)
    mark = len(sink_log.records)
    _, handler = start_sink(mosquitto, sink_loop, sink_log, documents(state))
    sink_log.wait_for(r"bus: .*sink-bus\.json.*used.*set aside|bus: .*sink-bus\.json", mark)
    assert [p.name.startswith("sink-bus.json.refused-") for p in state.iterdir()] == [True]
    publish(client, *early)
    assert answer(client, "early")["error"].startswith("signed before this appliance started")
    assert handler.calls == []
    publish(client, *command("later", at=time.time() + 1))
    assert answer(client, "later")["ok"] is True
    assert kept.exists() and os.stat(kept).st_mode & 0o777 == 0o600  # written afresh
