"""A signed MQTT command runs once, even across a restart of the appliance (issue 39,
item 7): a live appliance with a state folder (`server.state_dir`) and signed commands
(`commands.auth: hmac`) on a real mosquitto runs a signed restart; restarted, it refuses
the very same message (payload and signature) as a replay, though it is still within
the signature's tolerance. Before, the used signatures lived in memory only: the replay
ran again."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import paho.mqtt.client as mqtt
import pytest

from tests.security.signed_commands import (
    PREFIX,
    RESTART,
    answer_to,
    appliance_doc,
    publish,
    signed,
    until_subscribed,
)
from tests.server.live import LiveServer, write_yaml
from tests.sinks.conftest import Broker, Subscriber


@pytest.fixture
def client(broker: Broker, subscriber: Callable[..., Subscriber]) -> Subscriber:
    return subscriber(broker, f"{PREFIX}/cmd/reply", protocol=mqtt.MQTTv5)


def test_a_signed_command_replayed_after_a_restart_is_refused(
    broker: Broker, client: Subscriber, tmp_path: Path
) -> None:
    doc = appliance_doc(tmp_path, broker.port, state_dir="state")
    config = write_yaml(tmp_path, doc, "config.yaml")
    first = LiveServer(config, token=doc["server"]["token"]).start()
    try:
        until_subscribed(client)
        before = first.runtime.streams["cam"]
        message = signed(RESTART, {"id": "once"})
        publish(client, RESTART, *message)
        assert answer_to(client, "once")["ok"] is True
        assert first.runtime.streams["cam"] is not before  # it ran
    finally:
        first.stop()

    second = LiveServer(config, token=doc["server"]["token"]).start()
    try:
        until_subscribed(client)
        restarted = second.runtime.streams["cam"]
        client.messages.clear()
        publish(client, RESTART, *message)  # the very same message, as the broker saw it
        refused = answer_to(client, "once")
        assert refused["ok"] is False and refused["error"].startswith("replayed: "), refused
        assert second.runtime.streams["cam"] is restarted  # not run again
        (sink,) = second.get_json("/v1/sinks")["sinks"]
        assert sink["extra"]["commands_auth_refused"] >= 1
    finally:
        second.stop()
    kept = tmp_path / "state" / "sink-bus.json"  # where: the sink's name
    assert kept.stat().st_mode & 0o777 == 0o600
