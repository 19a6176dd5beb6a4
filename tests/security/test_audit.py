"""The audit beyond the API's routes (tests/security/test_roles.py has those): a command
from the broker is recorded as `mqtt`'s, a SIGHUP reload as `sighup`'s, and every entry
goes out as an `audit` event on the appliance's events topic, on a real `appliance
serve` with a real mosquitto."""

from __future__ import annotations

import json
import signal
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.sinks.conftest import Broker, Received, Subscriber
from tests.support.appliance import Served, start_served
from tests.support.media import MakeClip

TOKEN = "audit-admin-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
DRAW = {"name": "draw", "blocks": [{"id": "drawn", "type": "annotate"}],
        "outputs": {"video": "drawn"}}  # fmt: skip
WAIT_S = 30.0


@pytest.fixture(scope="module")
def served(
    broker: Broker, tmp_path_factory: pytest.TempPathFactory, make_clip: MakeClip
) -> Iterator[Served]:
    folder = tmp_path_factory.mktemp("audited")
    clip = make_clip(160, 120, fps=5, seconds=4.0)
    bus = {"type": "mqtt", "port": broker.port, "topic_prefix": "site", "protocol": "5",
           "client_id": "appliance-audit", "commands": {"enabled": True}}  # fmt: skip
    doc = {
        "server": {"token": TOKEN},
        "sinks": {"bus": bus},
        "streams": [
            {"id": "cam", "source": {"url": str(clip), "loop": True, "pace": "realtime"},
             "workflow": DRAW, "outputs": [{"sink": "bus"}]},
        ],
    }  # fmt: skip
    config = folder / "config.yaml"
    config.write_text(json.dumps(doc))
    served = start_served(config, folder)
    try:
        yield served
    finally:
        served.stop()


def audit(served: Served) -> list[dict[str, Any]]:
    request = urllib.request.Request(served.url + "/v1/audit", headers=AUTH)
    with urllib.request.urlopen(request, timeout=10) as answer:
        entries: list[dict[str, Any]] = json.loads(answer.read())["entries"]
    return entries


def audit_events(messages: list[Received]) -> list[dict[str, Any]]:
    bodies = [json.loads(m.payload) for m in messages if m.topic == "site/events"]
    return [b for b in bodies if b.get("type") == "audit"]


def restart_once(client: Subscriber) -> None:
    """A restart command, answered: the sink subscribes once it has connected, so one
    sent before is lost; each try has its own id, and the first answer ends them."""
    deadline = time.monotonic() + WAIT_S
    for attempt in range(1000):
        assert time.monotonic() < deadline, "no command was answered"
        request_id = f"r{attempt}"
        client.publish("site/cmd/streams/cam/restart", json.dumps({"id": request_id}).encode())
        try:
            client.wait_for(lambda ms, rid=request_id: _ok(ms, rid), 1.0)  # type: ignore[misc]
            return
        except AssertionError:
            continue


def _ok(messages: list[Received], request_id: str) -> bool:
    replies = [json.loads(m.payload) for m in messages if m.topic == "site/cmd/reply"]
    return any(r.get("id") == request_id and r.get("ok") for r in replies)


def test_a_command_from_the_broker_is_mqtts_and_each_change_is_an_event(
    served: Served, broker: Broker, subscriber: Callable[..., Subscriber]
) -> None:
    events = subscriber(broker, "site/events", "site/cmd/reply")
    restart_once(events)
    entry = next(e for e in audit(served) if e["action"] == "stream.restart")
    assert (entry["who"], entry["target"], entry["outcome"]) == ("mqtt", "cam", "ok")
    # The same entry went out as an event for the appliance as a whole.
    got = events.wait_for(lambda ms: any(e["who"] == "mqtt" for e in audit_events(ms)))
    event = next(e for e in audit_events(got) if e["who"] == "mqtt")
    assert (event["action"], event["target"], event["outcome"]) == ("stream.restart", "cam", "ok")
    assert TOKEN not in json.dumps([m.payload.decode() for m in got])


def test_a_sighup_reload_is_sighups(
    served: Served, broker: Broker, subscriber: Callable[..., Subscriber]
) -> None:
    events = subscriber(broker, "site/events")
    served.process.send_signal(signal.SIGHUP)
    got = events.wait_for(lambda ms: any(e["who"] == "sighup" for e in audit_events(ms)))
    event = next(e for e in audit_events(got) if e["who"] == "sighup")
    assert (event["action"], event["outcome"]) == ("config.reload", "ok")
    assert any(e["who"] == "sighup" for e in audit(served))
    lines = [line for line in Path(served.log_path).read_text().splitlines() if "audit {" in line]
    assert sum('"who": "sighup"' in line for line in lines) == 1  # logged once
