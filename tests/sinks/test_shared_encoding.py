"""What a stream's worker pays for its sinks: a result offered to MQTT and a webhook is
encoded once, on the sinks' loop (never on the worker thread, which has its next frame
to run), and both send those same bytes; a prediction still waiting to be encoded counts
against the queue's byte bound; delivery ids stay unique without a urandom read each.
Real parts: mosquitto, an aiohttp receiver, the runtime's Outputs and its `sinks` loop.
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from appliance.config import OutputConfig
from appliance.metrics import Metrics
from appliance.outputs import Outputs
from pipelines.types import Detections, FrameResult
from sinks import messages
from sinks.mqtt_config import MqttConfig
from sinks.webhook import WebhookConfig, WebhookSink
from tests.sinks.conftest import Broker, Subscriber
from tests.sinks.receiver import WAIT_S, Answer, LoopThread, Receiver

RESULTS = 6


def people(n: int) -> Detections:
    boxes = np.arange(n * 4, dtype=np.float32).reshape(n, 4) * 10.5
    return Detections(boxes, np.full(n, 0.5, np.float32), np.zeros(n, np.int64), ("person",) * n)


def frame_result(seq: int, rows: int = 2) -> FrameResult:
    now = time.perf_counter()
    image = np.zeros((8, 8, 3), np.uint8)
    outputs = {"people": people(rows), "count": {"in": seq, "out": 0, "total": seq}, "mask": image}
    return FrameResult("cam1", seq, None, time.time(), now - 0.02, now - 0.01, now, image, outputs)


@pytest.fixture
def encodes(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The thread of every prediction document made from now on: each is made to be
    encoded (sinks.messages.prediction)."""
    threads: list[str] = []
    real = messages.prediction

    def counted(result: FrameResult) -> dict[str, Any]:
        threads.append(threading.current_thread().name)
        return real(result)

    monkeypatch.setattr(messages, "prediction", counted)
    return threads


@pytest.fixture
def outputs(mosquitto: Broker, tmp_path: Path) -> Iterator[Callable[[str], Outputs]]:
    made: list[Outputs] = []

    def make(hook_url: str) -> Outputs:
        configs = {
            "bus": MqttConfig(type="mqtt", port=mosquitto.port, qos=1, client_id="enc-test"),
            "hook": WebhookConfig.model_validate(
                {"type": "webhook", "url": hook_url, "secret": "k"}
            ),
        }
        out = Outputs(configs, Metrics(), tmp_path)
        out.start()
        made.append(out)
        return out

    yield make
    for out in made:
        out.stop(5.0)


def test_a_result_is_encoded_once_on_the_sinks_loop_for_both_sinks(
    outputs: Callable[[str], Outputs],
    mosquitto: Broker,
    subscriber: Callable[..., Subscriber],
    encodes: list[str],
) -> None:
    sub = subscriber(mosquitto, "appliance/cam1/predictions")
    with Receiver() as rx:
        out = outputs(rx.url)
        deadline = time.monotonic() + WAIT_S
        while not out.sinks["bus"].status().up and time.monotonic() < deadline:
            time.sleep(0.02)
        publish = out.publisher("cam1", [OutputConfig(sink="bus"), OutputConfig(sink="hook")])
        sent = [frame_result(seq) for seq in range(RESULTS)]
        for result in sent:  # this thread plays the stream's worker
            publish(result)
        hooked = rx.wait_for(RESULTS)
        got = sub.wait_for(lambda ms: len(ms) >= RESULTS)
    # Once per result, however many sinks send it, and never on the worker's thread.
    assert encodes == ["sinks"] * RESULTS
    # Both sinks sent the very same bytes: the document of the result as it was offered
    # (its image and image outputs left out), whatever the worker did after.
    expected = [messages.encode(messages.prediction(r)) for r in sent]
    assert [m.payload for m in got] == expected
    assert [r.body for r in hooked] == expected
    assert "mask" not in hooked[0].json()["outputs"]


def test_a_waiting_prediction_counts_against_the_byte_bound(tmp_path: Path) -> None:
    """The receiver hangs: predictions wait unencoded, and the queue's max_bytes still
    drops the oldest by what each would encode to (a header and a row per detection)."""
    size = messages.PENDING_BASE_BYTES + 3 * messages.PENDING_ROW_BYTES
    with Receiver(default=Answer(hang=True)) as rx:
        queue = {"max_messages": 1000, "max_bytes": 4 * size}
        cfg = WebhookConfig.model_validate(
            {"type": "webhook", "url": rx.url, "concurrency": 1, "queue": queue}
        )
        sink = WebhookSink("hook", cfg, data_dir=tmp_path)
        with LoopThread("sink-loop") as lt:
            lt.call(sink.start())
            sink.offer(frame_result(0, rows=3))
            rx.wait_for(1)  # the only slot hangs on the first
            for seq in range(1, 11):
                sink.offer(frame_result(seq, rows=3))
            status = sink.status()
            assert (status.queue_depth, status.extra["queue_bytes"]) == (4, 4 * size)
            assert status.dropped == 6
            lt.call(sink.stop(0.1), WAIT_S)


def test_delivery_ids_are_unique_32_hex_digits(tmp_path: Path) -> None:
    with Receiver() as rx:
        sinks = [
            WebhookSink(name, WebhookConfig(type="webhook", url=rx.url), data_dir=tmp_path)
            for name in ("one", "two")
        ]
        with LoopThread("sink-loop") as lt:
            for sink in sinks:
                lt.call(sink.start())
            for seq in range(20):
                for sink in sinks:
                    sink.offer(frame_result(seq))
            got = rx.wait_for(40)
            for sink in sinks:
                lt.call(sink.stop(5.0), WAIT_S)
    ids = [r.headers["x-appliance-delivery"] for r in got]
    assert all(re.fullmatch(r"[0-9a-f]{32}", i) for i in ids)
    assert len(set(ids)) == 40  # across deliveries and across sinks
