"""Sink faults with real parts: a mosquitto broker restarted under load, a webhook receiver
that is down, slow, or flapping. Every result the stream offered is counted (an in-process
subscriber sees exactly what the sinks were offered) and looked for at the other end.

What docs/outputs.md promises, and so what is asserted:
- MQTT at QoS 1: results offered while the broker is away wait in the sink's bounded queue
  (10000 messages, 16 MiB) and are delivered in order after the reconnect; a message may
  arrive twice (dedupe on `stream` + `seq`).
- Webhooks: network errors and 5xx are retried with backoff; a delivery goes to the
  dead letters only once its `retries` are exhausted; the queue (1000) drops the oldest.
- No sink ever blocks a stream: its fps stays the source's.
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import closing, suppress
from functools import partial
from pathlib import Path
from typing import Any

import pytest

from appliance.config import parse_config
from appliance.runtime.runtime import Runtime
from pipelines.types import FrameResult
from sinks.base import SinkStatus
from tests.faults.figures import recording
from tests.faults.process_helpers import (
    DRAW,
    FPS,
    FPS_RATIO_MIN,
    WAIT_S,
    SlowReceiver,
    fps_over,
)
from tests.server.live import wait_for
from tests.sinks.conftest import Broker, Subscriber
from tests.sinks.receiver import Receiver, Request
from tests.support.media import MakeClip
from tests.support.processes import free_port

OUTAGE_S = 2.0  # how long a destination stays away
MQTT_BOUND = "QoS 1 queue: 10000 messages / 16 MiB"
HOOK_BOUND = "webhook queue: 1000 messages, retries before dead letters"
# Quick retries, so a destination back is found within a fraction of a second.
HOOK_BACKOFF = {"initial_s": 0.1, "max_s": 0.4, "multiplier": 2.0, "jitter": 0.2}

StartRuntime = Callable[..., tuple[Runtime, "Offered"]]


class Offered:
    """The seqs of every result the stream published (and so offered to its sinks):
    in-process subscribers are called right after the sinks' `offer`."""

    def __init__(self, rt: Runtime, stream_id: str) -> None:
        self._seqs: list[int] = []
        self._lock = threading.Lock()
        rt.subscribe(self._add, stream_id)

    def _add(self, result: FrameResult) -> None:
        with self._lock:
            self._seqs.append(result.seq)

    @property
    def seqs(self) -> list[int]:
        with self._lock:
            return list(self._seqs)


@pytest.fixture
def clip(make_clip: MakeClip) -> Path:
    return make_clip(width=160, height=120, fps=FPS, seconds=2.0)


@pytest.fixture
def start_runtime(tmp_path: Path, clip: Path) -> Iterator[StartRuntime]:
    """start_runtime(sinks, outputs) → a started runtime with one realtime stream `cam`,
    and the record of what it offered from its very first result."""
    started: list[Runtime] = []

    def start(sinks: dict[str, Any], outputs: list[Any]) -> tuple[Runtime, Offered]:
        source = {"url": str(clip), "loop": True, "pace": "realtime"}
        doc = {
            "sinks": sinks,
            "streams": [{"id": "cam", "source": source, "workflow": DRAW, "outputs": outputs}],
            "profiling": {"dir": str(tmp_path / "traces")},
        }
        rt = Runtime(parse_config(doc, tmp_path))
        started.append(rt)
        offered = Offered(rt, "cam")  # before the stream starts: every result
        rt.start()
        return rt, offered

    yield start
    for rt in started:
        rt.stop()


def sink(rt: Runtime, name: str) -> SinkStatus:
    return next(s for s in rt.sinks_status() if s.name == name)


def drained(rt: Runtime, name: str) -> bool:
    status = sink(rt, name)
    return status.queue_depth == 0 and int(status.extra.get("in_flight", 0)) == 0


def stop_stream_and_drain(rt: Runtime, *sinks: str) -> None:
    """No more results; then wait until each sink has nothing queued or in flight."""
    assert rt.remove_stream("cam"), "the stream's threads did not end"
    for name in sinks:
        wait_for(partial(drained, rt, name), WAIT_S, f"sink {name} to drain")


def counter(rt: Runtime, name: str, outcome: str) -> float:
    rt.sync_metrics()
    value = rt.metrics.registry.get_sample_value(
        "appliance_sink_messages_total", {"sink": name, "outcome": outcome}
    )
    return 0.0 if value is None else value


def first_occurrences(seqs: list[int]) -> list[int]:
    seen: set[int] = set()
    return [s for s in seqs if not (s in seen or seen.add(s))]  # type: ignore[func-returns-value]


# -- MQTT ---------------------------------------------------------------------------------
def test_a_broker_restart_under_load_loses_nothing_and_costs_the_stream_nothing(
    broker: Broker, start_runtime: StartRuntime
) -> None:
    """The broker is stopped for 2 s and started again on its port while a stream
    publishes every result at QoS 1: every result offered (before, during and after the
    outage) reaches a subscriber with a persistent session, in order, none dropped; the
    stream's fps does not move; the sink is connected again soon after the broker is back."""
    fault = f"MQTT broker stopped {OUTAGE_S:g} s under QoS 1 load, then back"
    topic = "site/cam/predictions"
    with (
        recording("mqtt_broker", fault, MQTT_BOUND) as row,
        closing(Subscriber(broker, [topic])) as sub,
    ):
        bus = {"type": "mqtt", "port": broker.port, "qos": 1, "topic_prefix": "site",
               "client_id": f"appliance-{uuid.uuid4().hex[:8]}",
               "reconnect": {"initial_s": 0.1, "max_s": 0.5}}  # fmt: skip
        rt, offered = start_runtime({"bus": bus}, ["bus"])
        stream = rt.streams["cam"]
        sub.wait_for(lambda ms: len(ms) >= 10, WAIT_S)  # connected and flowing
        before = fps_over(stream, 1.0)

        broker.stop()
        down_at = len(offered.seqs)
        wait_for(lambda: sink(rt, "bus").state == "reconnecting", WAIT_S, "the sink to notice")
        during = fps_over(stream, OUTAGE_S)
        row.others_fps_ratio = round(during / before, 3)
        waiting = sink(rt, "bus").queue_depth
        broker.start()
        back = time.monotonic()
        wait_for(lambda: sink(rt, "bus").state == "connected", WAIT_S, "the sink to reconnect")
        row.recovery_s = time.monotonic() - back
        time.sleep(0.5)  # results flow again after the outage
        stop_stream_and_drain(rt, "bus")

        seqs = offered.seqs
        want = set(seqs)
        received = arrived(sub, topic, want)
        row.lost = len(want - set(received))
        assert len(seqs) - down_at >= FPS  # the outage really had results to keep
        assert waiting >= FPS * OUTAGE_S * 0.5, waiting  # ... and they waited in the queue
        assert row.lost == 0, sorted(want - set(received))
        assert first_occurrences(received) == sorted(set(received))  # in order
        assert counter(rt, "bus", "dropped") == 0
        # Every result was acknowledged (besides the `online` and stream states).
        assert counter(rt, "bus", "sent") >= len(seqs)
        assert row.others_fps_ratio >= FPS_RATIO_MIN, (before, during)
        assert stream.failed_frames == 0


def arrived(sub: Subscriber, topic: str, want: set[int]) -> list[int]:
    """The seqs received on `topic`, once every one of `want` is there or WAIT_S has
    passed: a result lost must be counted (and recorded), not end the test in a wait."""
    with suppress(AssertionError):
        sub.wait_for(lambda ms: want <= {json.loads(m.payload)["seq"] for m in ms}, WAIT_S)
    return [json.loads(m.payload)["seq"] for m in sub.on(topic)]


# -- webhooks -----------------------------------------------------------------------------
def seqs_of(requests: list[Request], sink_name: str | None = None) -> list[int]:
    """The seqs the receiver got (from sink `sink_name` alone, by its X-Sink header)."""
    return [
        int(r.json()["seq"])
        for r in requests
        if sink_name is None or r.headers.get("x-sink") == sink_name
    ]


def dead_letters(rt: Runtime, name: str) -> list[dict[str, Any]]:
    path = Path(str(sink(rt, name).extra["dead_letter_file"]))
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def test_a_receiver_down_then_back_gets_every_result_and_dead_letters_wait_for_retries(
    start_runtime: StartRuntime,
) -> None:
    """Nothing listens on the webhook's port for 2 s, then a receiver does. A sink with
    enough retries delivers every result offered (none dead-lettered, none dropped). A sink
    with `retries: 2` dead-letters what it cannot deliver, each only after exactly 3
    attempts, and each result is delivered or dead-lettered: never both, never neither."""
    fault = f"webhook receiver down {OUTAGE_S:g} s, then back"
    with recording("webhook_down", fault, HOOK_BOUND) as row:
        port = free_port()  # refused: nothing listens yet
        url = f"http://127.0.0.1:{port}/hook"
        patient = {"type": "webhook", "url": url, "retries": 30, "backoff": HOOK_BACKOFF,
                   "headers": {"X-Sink": "patient"}}  # fmt: skip
        brief = {"type": "webhook", "url": url, "retries": 2, "headers": {"X-Sink": "brief"},
                 "backoff": {"initial_s": 0.05, "max_s": 0.05, "jitter": 0.0}}  # fmt: skip
        rt, offered = start_runtime({"patient": patient, "brief": brief}, ["patient", "brief"])
        stream = rt.streams["cam"]
        wait_for(lambda: len(offered.seqs) >= 5, WAIT_S, "results")
        during = fps_over(stream, OUTAGE_S)
        assert sink(rt, "patient").state == "failing"
        wait_for(lambda: sink(rt, "brief").dead_lettered > 0, WAIT_S, "a dead letter")
        with Receiver(port=port) as rx:
            back = time.monotonic()
            rx.wait_for(1, WAIT_S)
            row.recovery_s = rx.requests[0].time - back
            after = fps_over(stream, 0.5)  # results flow again
            row.others_fps_ratio = round(min(during, after) / FPS, 3)
            stop_stream_and_drain(rt, "patient", "brief")
            requests = rx.requests

        want = set(offered.seqs)
        got = seqs_of(requests, "patient")
        row.lost = len(want - set(got))
        assert row.lost == 0, sorted(want - set(got))
        status = sink(rt, "patient")
        assert (status.dead_lettered, status.dropped) == (0, 0)
        assert status.retried > 0 and counter(rt, "patient", "retried") == status.retried

        dead = dead_letters(rt, "brief")
        assert dead and all(d["attempts"] == 3 for d in dead), [d["attempts"] for d in dead]
        assert all("connect" in str(d["last_error"]).lower() for d in dead), dead[0]["last_error"]
        assert len(dead) == sink(rt, "brief").dead_lettered == counter(rt, "brief", "dead_lettered")
        dead_seqs = [int(d["body"]["seq"]) for d in dead]
        delivered = seqs_of(requests, "brief")
        assert not set(dead_seqs) & set(delivered)
        assert sorted(dead_seqs + delivered) == sorted(want)  # each exactly once
        assert row.others_fps_ratio >= FPS_RATIO_MIN, (during, after)


def test_a_slow_receiver_costs_the_stream_nothing_and_loses_nothing(
    start_runtime: StartRuntime,
) -> None:
    """The receiver takes 0.4 s per answer for 2 s (two slots: 5 deliveries/s against 30
    results/s): results wait in the bounded queue, the stream's fps does not move, and once
    the receiver is quick again every result offered arrives."""
    fault = f"webhook receiver 0.4 s per answer for {OUTAGE_S:g} s"
    with recording("webhook_slow", fault, HOOK_BOUND) as row, SlowReceiver() as rx:
        hook = {"type": "webhook", "url": rx.url, "concurrency": 2, "backoff": HOOK_BACKOFF}
        rt, offered = start_runtime({"hook": hook}, ["hook"])
        stream = rt.streams["cam"]
        rx.wait_for(5, WAIT_S)
        before = fps_over(stream, 1.0)
        rx.delay_s = 0.4
        during = fps_over(stream, OUTAGE_S)
        row.others_fps_ratio = round(during / before, 3)
        backlog = sink(rt, "hook").queue_depth
        rx.delay_s = 0.0
        quick = time.monotonic()
        wait_for(lambda: drained(rt, "hook"), WAIT_S, "the backlog to go out")
        row.recovery_s = time.monotonic() - quick
        stop_stream_and_drain(rt, "hook")
        requests = rx.requests

        want = set(offered.seqs)
        row.lost = len(want - set(seqs_of(requests)))
        assert backlog >= FPS, backlog  # the receiver really was slower than the results
        assert row.lost == 0, sorted(want - set(seqs_of(requests)))
        status = sink(rt, "hook")
        assert (status.dropped, status.dead_lettered) == (0, 0)
        assert row.others_fps_ratio >= FPS_RATIO_MIN, (before, during)


def test_a_flapping_receiver_loses_nothing(start_runtime: StartRuntime) -> None:
    """The receiver goes away and comes back on its port three times (0.4 s down, 0.4 s
    up): deliveries cut or refused are retried, and every result offered arrives; nothing
    is dead-lettered or dropped, and the stream's fps does not move."""
    fault = "webhook receiver flapping: 3 x (0.4 s down, 0.4 s up)"
    with recording("webhook_flapping", fault, HOOK_BOUND) as row:
        port = free_port()
        url = f"http://127.0.0.1:{port}/hook"
        hook = {"type": "webhook", "url": url, "retries": 30, "backoff": HOOK_BACKOFF}
        rt, offered = start_runtime({"hook": hook}, ["hook"])
        stream = rt.streams["cam"]
        requests: list[Request] = []
        count, began = stream.rate.count, time.monotonic()
        for _ in range(3):
            time.sleep(0.4)  # down
            with Receiver(port=port) as rx:
                time.sleep(0.4)  # up
            requests += rx.requests
        fps = (stream.rate.count - count) / (time.monotonic() - began)
        row.others_fps_ratio = round(fps / FPS, 3)
        with Receiver(port=port) as rx:
            back = time.monotonic()
            rx.wait_for(1, WAIT_S)
            row.recovery_s = rx.requests[0].time - back
            stop_stream_and_drain(rt, "hook")
            requests += rx.requests

        want = set(offered.seqs)
        row.lost = len(want - set(seqs_of(requests)))
        assert row.lost == 0, sorted(want - set(seqs_of(requests)))
        status = sink(rt, "hook")
        assert (status.dropped, status.dead_lettered) == (0, 0)
        assert status.retried > 0
        assert row.others_fps_ratio >= FPS_RATIO_MIN, fps
