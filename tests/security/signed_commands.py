"""Signed MQTT commands to a live appliance, for the tests of the broker's trust boundary:
the appliance's config (the bundled clip as a camera, its results and commands on a real
mosquitto, `commands.auth: hmac` with the key in a file), and an MQTT 5 client that
publishes commands with a `signature` user property and waits for their answers."""

from __future__ import annotations

import json
import time
import uuid
from pathlib import Path
from typing import Any

from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from sinks.signing import sign
from tests.server.conftest import config_doc, demo_stream
from tests.sinks.conftest import WAIT_S, Received, Subscriber

SECRET = b"cmd-secret-5d0a"  # read from a file by the appliance, as from a mounted secret
PREFIX = "site"
RESTART = f"{PREFIX}/cmd/streams/cam/restart"


def appliance_doc(folder: Path, broker_port: int, **server: Any) -> dict[str, Any]:
    """A config: stream `cam` (the clip, in real time) whose results go to sink `bus`,
    which takes signed commands under `site/cmd/`; `server` adds server fields."""
    (folder / "cmd-secret").write_bytes(SECRET + b"\n")
    commands = {"enabled": True, "auth": "hmac", "secret_file": "cmd-secret"}
    bus = {
        "type": "mqtt",
        "port": broker_port,
        "topic_prefix": PREFIX,
        "protocol": "5",
        "client_id": f"appliance-{uuid.uuid4().hex[:8]}",
        "commands": commands,
        "reconnect": {"initial_s": 0.1, "max_s": 1.0},
    }
    return {
        **config_doc({**demo_stream("cam"), "outputs": ["bus"]}, **server),
        "sinks": {"bus": bus},
    }


def signed(topic: str, body: dict[str, Any], at: float | None = None) -> tuple[bytes, str]:
    """A command's payload and its signature, made now (or at `at`, Unix seconds)."""
    payload = json.dumps(body).encode()
    return payload, sign(SECRET, topic, payload, at)


def publish(client: Subscriber, topic: str, payload: bytes, signature: str | None) -> None:
    """Publish a command (QoS 1, not retained) with `signature` as its user property."""
    props = Properties(PacketTypes.PUBLISH)  # type: ignore[no-untyped-call]
    if signature is not None:
        props.UserProperty = ("signature", signature)
    client.publish(topic, payload, props)


def answer_to(client: Subscriber, request_id: str, timeout: float = WAIT_S) -> dict[str, Any]:
    """The answer to the command with `request_id` on `<prefix>/cmd/reply`."""
    got = client.wait_for(lambda ms: any(_id(m) == request_id for m in ms), timeout)
    (reply,) = [m for m in got if _id(m) == request_id]
    return dict(json.loads(reply.payload))


def until_subscribed(client: Subscriber) -> None:
    """Signed pings (a restart of a stream the appliance does not have) until one reaches
    its handler: it has subscribed, and takes commands signed now (in the sink's first
    second, one signed that second may be refused as signed before it started)."""
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        ping = f"ping-{uuid.uuid4()}"
        topic = f"{PREFIX}/cmd/streams/none/restart"
        publish(client, topic, *signed(topic, {"id": ping}))
        try:
            if answer_to(client, ping, 1.0).get("error") == "unknown stream 'none'":
                return
        except AssertionError:
            continue
    raise AssertionError("the appliance never took a command")


def _id(message: Received) -> Any:
    if not message.topic.startswith(f"{PREFIX}/cmd/"):
        return None
    return json.loads(message.payload).get("id")
