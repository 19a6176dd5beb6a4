"""One malformed signed command must not silence the MQTT sink (issue 39, item 6): a live
appliance streaming the clip, its results and signed commands (`commands.auth: hmac`) on
a real mosquitto. A command whose signature's time is `t=²` (a digit to `str.isdigit`,
not to `int`) raised ValueError in paho's network thread, which ended: later commands got
no answer, results stopped, and `/v1/sinks` still said `connected` while the queue grew.
Now it is refused with an answer, and the sink goes on."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

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
from tests.server.live import LiveServer, wait_for, write_yaml
from tests.sinks.conftest import WAIT_S, Broker, Subscriber

PREDICTIONS = f"{PREFIX}/cam/predictions"
MORE = 10  # results that must still arrive after the commands


@pytest.fixture
def appliance(broker: Broker, tmp_path: Path) -> Iterator[LiveServer]:
    doc = appliance_doc(tmp_path, broker.port)
    live = LiveServer(write_yaml(tmp_path, doc, "config.yaml"), token=doc["server"]["token"])
    live.start()
    try:
        yield live
    finally:
        live.stop()


@pytest.fixture
def client(broker: Broker, subscriber: Callable[..., Subscriber]) -> Subscriber:
    return subscriber(broker, f"{PREFIX}/cmd/reply", PREDICTIONS, protocol=mqtt.MQTTv5)


def bus(appliance: LiveServer) -> dict[str, Any]:
    (sink,) = appliance.get_json("/v1/sinks")["sinks"]
    return dict(sink)


def predictions(client: Subscriber) -> int:
    return len(client.on(PREDICTIONS))


def test_a_malformed_signature_time_leaves_commands_and_results_flowing(
    appliance: LiveServer, client: Subscriber
) -> None:
    client.wait_for(lambda ms: any(m.topic == PREDICTIONS for m in ms))  # results flow
    until_subscribed(client)
    before = appliance.runtime.streams["cam"]

    poison = json.dumps({"id": "poison"}).encode()
    publish(client, RESTART, poison, "t=²,v1=" + "0" * 64)
    publish(client, RESTART, *signed(RESTART, {"id": "good"}))

    refused = answer_to(client, "poison")
    assert refused["ok"] is False and refused["error"].startswith(
        "bad signature: malformed signature"
    ), refused
    assert answer_to(client, "good")["ok"] is True  # answered: the sink still reads
    assert appliance.runtime.streams["cam"] is not before  # and it ran: cam restarted

    # Results keep flowing after the commands, and the sink delivers them as it says.
    seen, sent = predictions(client), bus(appliance)["sent"]
    client.wait_for(lambda ms: sum(m.topic == PREDICTIONS for m in ms) >= seen + MORE)
    wait_for(lambda: bus(appliance)["sent"] >= sent + MORE, WAIT_S, "the sink to send more")
    # The queue is drained again and again (beyond paho's window of unacknowledged
    # messages, nothing waits): it is not growing.
    wait_for(lambda: waiting(bus(appliance)) == 0, WAIT_S, "the sink's queue to drain")
    sink = bus(appliance)
    assert sink["state"] == "connected" and sink["up"] is True
    assert sink["dropped"] == 0 and sink["extra"]["commands_auth_refused"] >= 1


def waiting(sink: dict[str, Any]) -> int:
    """Messages queued and not yet handed to paho."""
    return int(sink["queue_depth"]) - int(sink["extra"]["in_flight"])
