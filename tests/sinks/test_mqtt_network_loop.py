"""paho's network thread must not die silently (issue 39, item 6), on a real mosquitto.
An exception in one of the sink's paho callbacks is logged (ERROR, with the traceback and
the sink's name, once a minute at most) and counted, and paho goes on reading; and a
network thread that ended all the same is seen, reported in the sink's status and
started again, and the sink delivers again."""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import paho.mqtt.client as mqtt
import pytest
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties
from pydantic import BaseModel

from sinks.base import SinkContext
from sinks.mqtt.sink import MqttSink
from sinks.signing import sign
from tests.sinks.conftest import Broker, LogWatch, SinkLoop, Subscriber
from tests.sinks.test_mqtt import Handler, config, has_seqs, result

M = TypeVar("M", bound=BaseModel)
SECRET = "loop-test-key"
TOPIC = "t/cmd/streams/cam/restart"
MakeSubscriber = Callable[..., Subscriber]


class BrokenStore:
    """A kept document whose writes fail with a bug (not the OSError of a full disk)
    the first `failures` times: the sink's own callback then raises on paho's thread."""

    def __init__(self, failures: int) -> None:
        self.failures = failures

    def read(self, model: type[M]) -> M | None:
        return None

    def write(self, body: BaseModel) -> None:
        if self.failures > 0:
            self.failures -= 1
            raise RuntimeError("store bug")


def publish_signed(client: Subscriber, request_id: str) -> None:
    payload = json.dumps({"id": request_id}).encode()
    props = Properties(PacketTypes.PUBLISH)  # type: ignore[no-untyped-call]
    props.UserProperty = ("signature", sign(SECRET.encode(), TOPIC, payload, time.time() + 1))
    client.publish(TOPIC, payload, props)


def test_an_exception_in_a_callback_is_logged_and_paho_goes_on(
    mosquitto: Broker,
    subscriber: MakeSubscriber,
    sink_loop: SinkLoop,
    sink_log: LogWatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    cfg = config(
        mosquitto, protocol="5", commands={"enabled": True, "auth": "hmac", "secret": SECRET}
    )
    handler = Handler()
    context = SinkContext(data_dir=Path("."), on_command=handler, kept=BrokenStore(3))
    sink = sink_loop.start(MqttSink.build("bus", cfg, context))
    sink_log.wait_for("commands on t/cmd/#")
    client: Subscriber = subscriber(mosquitto, "t/cmd/reply", protocol=mqtt.MQTTv5)
    caplog.set_level(logging.ERROR, "sinks.mqtt")
    for i in range(3):  # each raises in on_message: a flood is logged once
        publish_signed(client, f"lost-{i}")
    publish_signed(client, "after")
    client.wait_for(lambda ms: [json.loads(m.payload).get("id") for m in ms] == ["after"])
    assert handler.calls == [("restart", {"stream": "cam"})]  # paho's thread still reads

    (logged,) = [r for r in caplog.records if r.name == "sinks.mqtt" and r.exc_info]
    assert logged.levelno == logging.ERROR and "bus" in logged.getMessage()
    assert "on_message" in logged.getMessage()
    assert logged.exc_info is not None and str(logged.exc_info[1]) == "store bug"
    extra = sink.status().extra
    assert (extra["callback_errors"], extra["network_restarts"]) == (3, 0)


def test_a_network_thread_that_ended_is_reported_and_restarted(
    mosquitto: Broker, subscriber: MakeSubscriber, sink_loop: SinkLoop, sink_log: LogWatch
) -> None:
    sub: Subscriber = subscriber(mosquitto, "t/cam/predictions")
    sink = sink_loop.start(MqttSink("bus", config(mosquitto)))
    sink_log.wait_for("connected")
    sink.offer(result(1))
    sub.wait_for(has_seqs([1]))
    mark = len(sink_log.records)

    # paho's own API, from outside: its network thread ends while the sink runs.
    assert sink._link is not None
    sink._link.client.loop_stop()
    sink.offer(result(2))

    sink_log.wait_for(r"mqtt sink bus reconnecting .*network thread had ended", mark)
    sub.wait_for(has_seqs([1, 2]))  # restarted: it delivers again
    sink_log.wait_for(r"mqtt sink bus connected", mark)
    status = sink.status()
    assert status.state == "connected" and status.extra["network_restarts"] == 1
    assert status.last_error is not None and "network thread had ended" in status.last_error
    assert status.dropped == 0
