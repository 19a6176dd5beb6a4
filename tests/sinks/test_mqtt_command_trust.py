"""MQTT commands across the broker's trust boundary, on a live appliance (in-process HTTP
server, the bundled clip as a camera) and a real mosquitto, driven by a paho MQTT 5
client: answers go only under the appliance's prefix, no structure a sender chose is
echoed, signed commands (`commands.auth: hmac`) refuse what is unsigned, badly signed,
late or replayed, and a command's arguments are exactly what the HTTP route accepts."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import paho.mqtt.client as mqtt
import pytest
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from sinks.mqtt.config import MqttConfig
from sinks.mqtt.sink import MqttSink
from sinks.signing import sign
from tests.server.conftest import WAIT_S, config_doc, demo_stream
from tests.server.live import LiveServer, wait_for, write_yaml
from tests.sinks.conftest import Broker, LogWatch, Received, SinkLoop, Subscriber

SECRET = b"cmd-secret-7c1e"  # the appliance reads it from a file, as from a mounted secret
MAX_WINDOW_S = 5
MakeSubscriber = Callable[..., Subscriber]


@pytest.fixture(scope="module")
def appliance(broker: Broker, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    folder = tmp_path_factory.mktemp("appliance")
    (folder / "cmd-secret").write_bytes(SECRET + b"\n")
    commands = {"enabled": True, "auth": "hmac", "secret_file": "cmd-secret"}
    bus = {"type": "mqtt", "port": broker.port, "topic_prefix": "site", "protocol": "5",
           "client_id": "appliance-trust", "commands": commands}  # fmt: skip
    doc = {**config_doc(demo_stream("cam")), "sinks": {"bus": bus},
           "profiling": {"max_window_s": MAX_WINDOW_S}}  # fmt: skip
    live = LiveServer(write_yaml(folder, doc, "config.yaml"), token=doc["server"]["token"])
    live.start()
    try:
        wait_for(lambda: live.stream("cam")["frames_processed"] > 0, WAIT_S, "cam processing")
        yield live
    finally:
        live.stop()


@pytest.fixture
def client(appliance: LiveServer, broker: Broker, subscriber: MakeSubscriber) -> Subscriber:
    """An MQTT 5 client on the reply topics (and a victim's topic); the appliance has
    subscribed, and takes commands signed now, once one of this client's is answered
    by the handler (not refused as signed before the sink started, in its first second)."""
    sub: Subscriber = subscriber(
        broker, "site/cmd/reply", "site/cmd/response/#", "victim/#", protocol=mqtt.MQTTv5
    )
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        ping = send(sub, "site/cmd/streams/none/restart", {"id": f"ping-{uuid.uuid4()}"})
        ping_id = json.loads(ping)["id"]
        answers = [m for m in _answers(sub, ping, 1.0) if _id(m) == ping_id]
        if any(json.loads(m.payload).get("error") == "unknown stream 'none'" for m in answers):
            return sub
    raise AssertionError("the appliance never answered a command")


def send(
    client: Subscriber,
    topic: str,
    body: dict[str, Any],
    *,
    secret: bytes | None = SECRET,
    signed_at: float | None = None,
    **props: Any,
) -> bytes:
    """Publish a command, signed with `secret` at `signed_at` (unless None); its payload."""
    payload = json.dumps(body).encode()
    header = None if secret is None else sign(secret, topic, payload, signed_at)
    publish(client, topic, payload, header, **props)
    return payload


def publish(
    client: Subscriber,
    topic: str,
    payload: bytes,
    signature: str | None,
    response_topic: str | None = None,
    correlation: bytes | None = None,
) -> None:
    props = Properties(PacketTypes.PUBLISH)  # type: ignore[no-untyped-call]
    if signature is not None:
        props.UserProperty = ("signature", signature)
    if response_topic is not None:
        props.ResponseTopic = response_topic
    if correlation is not None:
        props.CorrelationData = correlation
    client.publish(topic, payload, props)


def _answers(client: Subscriber, payload: bytes, timeout: float) -> list[Received]:
    request_id = json.loads(payload)["id"]
    try:
        return client.wait_for(lambda ms: any(_id(m) == request_id for m in ms), timeout)
    except AssertionError:
        return []


def _id(message: Received) -> Any:
    return json.loads(message.payload).get("id")


def after(client: Subscriber) -> list[Received]:
    """Every message until the answer to a command sent now, which comes after whatever
    the commands sent before it brought: the sink queues a refusal's answer as the
    command arrives, each answer in order of the commands (sinks/mqtt/sink.py's `request`),
    and the broker keeps their order. That answer is not in the list."""
    request_id = f"after-{uuid.uuid4()}"
    send(client, "site/cmd/streams/none/restart", {"id": request_id})
    got = client.wait_for(lambda ms: any(_id(m) == request_id for m in ms))
    return [m for m in got if _id(m) != request_id]


def answer_to(client: Subscriber, request_id: Any, topic: str = "site/cmd/reply") -> dict[str, Any]:
    """The one answer with `request_id`, which must arrive on `topic`."""
    got = client.wait_for(lambda ms: any(_id(m) == request_id for m in ms))
    (answer,) = [m for m in got if _id(m) == request_id]
    assert answer.topic == topic, answer
    return dict(json.loads(answer.payload))


# -- (a) answers only under the prefix ------------------------------------------------------
def test_a_response_topic_outside_the_prefix_is_refused(
    appliance: LiveServer, client: Subscriber
) -> None:
    before = appliance.runtime.streams["cam"]
    send(client, "site/cmd/streams/cam/restart", {"id": "away"}, response_topic="victim/x")
    answer = answer_to(client, "away")  # on the appliance's own reply topic instead
    assert answer["ok"] is False and answer["error"].startswith("response topic refused")
    assert "victim" not in answer["error"]
    assert appliance.runtime.streams["cam"] is before  # refused: not run
    # Under <prefix>/cmd/response/ the answer goes there, with its correlation data.
    mine, corr = "site/cmd/response/me", b"c-42"
    send(client, "site/cmd/streams/none/restart", {"id": "mine"}, response_topic=mine,
         correlation=corr)  # fmt: skip
    answer = answer_to(client, "mine", mine)
    assert answer == {"ok": False, "command": "restart", "id": "mine",
                      "error": "unknown stream 'none'"}  # fmt: skip
    assert client.on(mine)[-1].properties.CorrelationData == corr
    # The victim's topic stayed quiet, up to the answer to the command sent after (`mine`).
    assert client.on("victim/x") == []


# -- (b) nothing chosen by the sender is echoed, but a short id -----------------------------
@pytest.mark.parametrize(
    "field, value",
    [("id", {"to": "victim"}), ("id", ["a"]), ("correlation", {"x": 1}), ("id", "x" * 129),
     ("id", "bell\a")],
)  # fmt: skip
def test_an_id_that_is_not_short_and_plain_is_refused_not_echoed(
    appliance: LiveServer, client: Subscriber, field: str, value: Any
) -> None:
    before = appliance.runtime.streams["cam"]
    client.messages.clear()
    send(client, "site/cmd/streams/cam/restart", {field: value})
    (reply,) = after(client)  # one answer, and no other
    answer = json.loads(reply.payload)
    assert reply.topic == "site/cmd/reply"
    assert answer["ok"] is False and set(answer) == {"ok", "command", "error"}, answer
    assert answer["error"].startswith(f"{field}: an integer or a string of at most 128")
    assert json.dumps(value)[1:-1] not in reply.payload.decode()
    assert appliance.runtime.streams["cam"] is before


# -- (c) signed commands ---------------------------------------------------------------------
def test_signed_commands_refuse_unsigned_wrong_late_and_replayed(
    appliance: LiveServer, client: Subscriber
) -> None:
    topic = "site/cmd/streams/cam/restart"
    before = appliance.runtime.streams["cam"]
    refused_before = _auth_refusals(appliance)
    send(client, topic, {"id": "unsigned"}, secret=None)
    send(client, topic, {"id": "wrong"}, secret=b"not-the-secret")
    send(client, topic, {"id": "late"}, signed_at=time.time() - 400)  # tolerance: 300 s
    # Signed for another stream's topic, sent to this one: the topic is signed too.
    # Signed for another stream's restart, sent as this one's: the topic is signed too.
    moved = json.dumps({"id": "moved"}).encode()
    publish(client, topic, moved, sign(SECRET, "site/cmd/streams/other/restart", moved))
    errors = {i: answer_to(client, i)["error"] for i in ("unsigned", "wrong", "late", "moved")}
    assert errors["unsigned"].startswith("unsigned: commands.auth is hmac")
    assert errors["wrong"].startswith("bad signature: signature does not match")
    assert (
        errors["late"].startswith("bad signature: signature time") and "tolerance" in errors["late"]
    )
    assert errors["moved"].startswith("bad signature: signature does not match")
    assert not any(SECRET.decode() in e for e in errors.values())
    assert appliance.runtime.streams["cam"] is before  # none of them ran

    payload = json.dumps({"id": "good"}).encode()
    header = sign(SECRET, topic, payload)
    publish(client, topic, payload, header)
    assert answer_to(client, "good")["ok"] is True
    restarted = appliance.runtime.streams["cam"]
    assert restarted is not before  # the signed one ran
    # The same message again, as any client that saw it on the broker can send it.
    client.messages.clear()
    publish(client, topic, payload, header)
    assert answer_to(client, "good")["error"].startswith("replayed: this signature")
    assert appliance.runtime.streams["cam"] is restarted  # not run again
    assert _auth_refusals(appliance) - refused_before == 5  # counted, shown in /v1/sinks


def _auth_refusals(appliance: LiveServer) -> int:
    (sink,) = appliance.get_json("/v1/sinks")["sinks"]
    return int(sink["extra"]["commands_auth_refused"])


# -- (d) the same arguments as the HTTP route ----------------------------------------------
ARGUMENTS: list[tuple[dict[str, Any], bool, str | None]] = [  # (body, accepted, refusal's field)
    ({"duration_s": 0.3}, True, None),
    ({"duration_s": 1}, True, None),
    ({"duration_s": 0.3, "streams": ["cam"], "ort_operators": False}, True, None),
    ({"duration_s": 0.3, "streams": None}, True, None),
    ({"duration_s": 1, "ort_operators": "yes"}, False, "ort_operators"),
    ({"duration_s": 1, "ort_operators": 1}, False, "ort_operators"),
    ({}, False, "duration_s"),
    ({"duration_s": 0}, False, "duration_s"),
    ({"duration_s": -1}, False, "duration_s"),
    ({"duration_s": MAX_WINDOW_S + 1}, False, "duration_s"),
    ({"duration_s": "1"}, False, "duration_s"),
    ({"duration_s": True}, False, "duration_s"),
    ({"duration_s": 1, "streams": "cam"}, False, "streams"),
    ({"duration_s": 1, "streams": ["nope"]}, False, "streams"),
    ({"duration_s": 1, "seconds": 5}, False, "seconds"),
]


def test_profiling_arguments_are_the_http_routes(appliance: LiveServer, client: Subscriber) -> None:
    """Each body through POST /v1/profiling and through `<prefix>/cmd/profiling`: both
    accept it, or both refuse it naming the same field."""
    differ = []
    for i, (body, accepted, field) in enumerate(ARGUMENTS):
        http = appliance.call("POST", "/v1/profiling", json_body=body)
        if http.status == 202:
            _finish(appliance, http.json()["id"])
        send(client, "site/cmd/profiling", {**body, "id": i})
        answer = answer_to(client, i)
        if answer["ok"]:
            _finish(appliance, answer["result"]["id"])
        http_error = "" if http.status == 202 else " ".join(http.error["details"])
        mqtt_error = answer.get("error", "")
        same = (http.status == 202, answer["ok"]) == (accepted, accepted)
        named = field is None or (field in http_error and field in mqtt_error)
        if not (same and named):
            differ.append((body, http.status, http_error, mqtt_error))
    assert differ == []


def _finish(appliance: LiveServer, window_id: str) -> None:
    path = f"/v1/profiling/{window_id}"
    wait_for(lambda: appliance.get_json(path)["state"] != "running", WAIT_S, "the window to end")


# -- configuration --------------------------------------------------------------------------
def test_auth_needs_mqtt5_and_a_secret() -> None:
    base = {"type": "mqtt", "commands": {"enabled": True, "auth": "hmac", "secret": "k3y-x9"}}
    with pytest.raises(ValueError, match=r'commands.auth: hmac needs protocol "5"'):
        MqttConfig.model_validate({**base, "protocol": "3.1.1"})
    with pytest.raises(ValueError, match=r"auth: hmac needs one of secret, secret_file"):
        MqttConfig.model_validate({"type": "mqtt", "commands": {"auth": "hmac"}})
    with pytest.raises(ValueError, match=r"secret, secret_file: only with auth: hmac"):
        MqttConfig.model_validate({"type": "mqtt", "commands": {"secret": "k"}})
    cfg = MqttConfig.model_validate(base)
    assert "k3y-x9" not in repr(cfg) and cfg.commands.tolerance_s == 300


def test_commands_without_auth_warn_at_start(
    broker: Broker, sink_loop: SinkLoop, sink_log: LogWatch
) -> None:
    cfg = MqttConfig.model_validate({"type": "mqtt", "port": broker.port, "topic_prefix": "w",
                                     "commands": {"enabled": True}})  # fmt: skip
    sink_loop.start(MqttSink("bus", cfg))
    sink_log.wait_for(r"bus: commands are enabled without authentication.*w/cmd/#")
