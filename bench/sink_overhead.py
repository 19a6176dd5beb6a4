"""Outputs under load: what MQTT (QoS 1) and a webhook on every frame cost a stream, and
what one MQTT sink sustains to a local broker.

1. Stream cost: one stream, the bundled clip as a file source with `pace: fast`, the
   person detector; every result offered to an MQTT sink at QoS 1 (a real mosquitto) and
   to a webhook (a real aiohttp receiver), vs the same run without outputs. The runs
   alternate in this process; the figure is the median of the per-round ratios (drift of
   a noisy machine cancels within a round). Target >= 0.97.
2. Sink throughput: results offered to one MQTT sink as fast as it takes them; the
   messages per second the broker acknowledges; and, offered at a camera's 30 Hz, the
   age each message has when a subscriber receives it (offer -> broker -> subscriber:
   what the sink adds to a frame's age), p50 and p99.

Needs `mosquitto` (Debian; `sh tests/install_deps.sh` installs it).
"""

from __future__ import annotations

import sys
from pathlib import Path

# Run as `python bench/sink_overhead.py`: the repo root first on the path, for `bench._common`
# and the tests' broker and receiver.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import contextlib
import json
import os
import shutil
import statistics
import subprocess
import threading
import time
import urllib.request
from collections.abc import Iterator
from typing import Any

import numpy as np
import paho.mqtt.client as mqtt
from paho.mqtt.enums import CallbackAPIVersion

from appliance.config import parse_config
from appliance.runtime import Runtime
from bench._common import ROOT, parse_args, report
from pipelines.types import FrameResult
from sinks.mqtt import MqttConfig, MqttSink
from tests.sinks.conftest import Broker, free_port
from tests.sinks.receiver import LoopThread
from tests.support.appliance import DEMO_CLIP, detect_workflow, person_model

TARGET_RATIO = 0.97
AGE_RATE_HZ = 30.0  # a camera's rate: the age a message has at the subscriber, unqueued
# The webhook receiver runs in a process of its own: in this one it would take the GIL
# and the CPU from the stream it is measuring.
RECEIVER = """
import sys
from aiohttp import web
count = 0
async def hook(request):
    global count
    await request.read()
    count += 1
    return web.Response()
async def seen(request):
    return web.json_response(count)
app = web.Application()
app.router.add_post("/hook", hook)
app.router.add_get("/count", seen)
web.run_app(app, host="127.0.0.1", port=int(sys.argv[1]), print=None)
"""


def stream_fps(frames: int, sinks: dict[str, Any], folder: Path) -> float:
    stream = {"id": "bench", "workflow": detect_workflow(), "outputs": list(sinks),
              "source": {"url": str(DEMO_CLIP), "pace": "fast", "loop": True}}  # fmt: skip
    # BENCH_SESSION: session options to try (JSON), as bench/_reference.py takes them.
    model = {**person_model(), "session": json.loads(os.environ.get("BENCH_SESSION", "{}"))}
    doc = {"models": {"person": model}, "sinks": sinks, "streams": [stream],
           "profiling": {"dir": str(folder / "traces")}}  # fmt: skip
    runtime = Runtime(parse_config(doc, folder), max_frames=frames)
    runtime.start()
    try:
        if not runtime.wait_done(timeout=600):
            raise SystemExit("the run did not finish")
    finally:
        runtime.stop()
    return runtime.streams["bench"].rate.overall()


def stream_cost(rounds: int, frames: int, broker: Broker, hook: str, folder: Path) -> list[float]:
    sinks = {"bus": {"type": "mqtt", "port": broker.port, "qos": 1, "client_id": "bench-bus"},
             "hook": {"type": "webhook", "url": hook, "secret": "bench"}}  # fmt: skip
    ratios = []
    for i in range(rounds):
        plain = stream_fps(frames, {}, folder)
        with_sinks = stream_fps(frames, sinks, folder)
        ratios.append(with_sinks / plain)
        print(f"round {i + 1}: no sinks {plain:.1f} fps, MQTT + webhook {with_sinks:.1f} fps")
    return ratios


def result(seq: int) -> FrameResult:
    now, mono = time.time(), time.perf_counter()
    image = np.zeros((4, 4, 3), np.uint8)
    people = {"in": seq, "out": 0, "total": seq}
    return FrameResult("bench", seq, None, now, mono, mono, mono, image, {"crossings": people})


@contextlib.contextmanager
def receiver() -> Iterator[str]:
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-c", RECEIVER, str(port)])
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(100):  # up within 10 s
            try:
                urllib.request.urlopen(url + "/count", timeout=1).close()
                break
            except OSError:
                time.sleep(0.1)
        yield url
    finally:
        proc.terminate()
        proc.wait(10)


def deliveries(url: str) -> int:
    with urllib.request.urlopen(url + "/count", timeout=5) as resp:
        return int(json.load(resp))


def mqtt_sink(broker: Broker, loop: LoopThread) -> MqttSink:
    cfg = MqttConfig(type="mqtt", port=broker.port, qos=1, client_id="bench-pub",
                     queue={"max_messages": 1000})  # fmt: skip
    sink = MqttSink("bus", cfg)
    loop.call(sink.start())
    while sink.status().state != "connected":
        time.sleep(0.05)
    return sink


def mqtt_age(broker: Broker, seconds: float) -> list[float]:
    """Ages in ms at a subscriber of results offered at a camera's rate."""
    ages: list[float] = []
    sub = subscriber(broker, ages)
    with LoopThread("bench-sinks") as loop:
        sink = mqtt_sink(broker, loop)
        start = time.perf_counter()
        for seq in range(int(seconds * AGE_RATE_HZ)):
            time.sleep(max(0.0, start + seq / AGE_RATE_HZ - time.perf_counter()))
            sink.offer(result(seq))
        loop.call(sink.stop(10.0), 15.0)
    time.sleep(0.5)  # the last messages' way to the subscriber
    sub.loop_stop()
    sub.disconnect()
    return ages


def subscriber(broker: Broker, ages: list[float]) -> mqtt.Client:
    sub = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=f"bench-sub-{time.time_ns()}")

    def on_message(client: Any, userdata: Any, msg: mqtt.MQTTMessage) -> None:
        ages.append((time.time() - json.loads(msg.payload)["capture_time"]) * 1000)

    subscribed = threading.Event()
    sub.on_message = on_message
    sub.on_subscribe = lambda *_: subscribed.set()
    sub.on_connect = lambda client, *_: client.subscribe("appliance/bench/predictions", 1)
    sub.connect("127.0.0.1", broker.port)
    sub.loop_start()
    subscribed.wait(10)
    return sub


def mqtt_throughput(broker: Broker, seconds: float) -> float:
    """Messages per second the broker acknowledges, offered as fast as the sink takes them."""
    with LoopThread("bench-sinks") as loop:
        sink = mqtt_sink(broker, loop)
        start, seq = time.perf_counter(), 0
        while time.perf_counter() - start < seconds:
            # Offer at the pace the sink takes them: a full queue would only measure drops.
            if sink.status().queue_depth < 500:
                sink.offer(result(seq))
                seq += 1
            else:
                time.sleep(0.001)
        loop.call(sink.stop(10.0), 15.0)
        return sink.status().sent / (time.perf_counter() - start)


def main() -> None:
    args = parse_args(__doc__.splitlines()[0])
    if shutil.which("mosquitto") is None:
        raise SystemExit("mosquitto is needed: sh tests/install_deps.sh")
    rounds, frames, seconds = (3, 120, 5.0) if args.quick else (7, 400, 15.0)
    folder = ROOT / "bench" / ".work"
    folder.mkdir(parents=True, exist_ok=True)
    broker = Broker(free_port(), folder)
    broker.start()
    try:
        with receiver() as hook:
            ratios = stream_cost(rounds, frames, broker, hook + "/hook", folder)
            delivered = deliveries(hook)
        rate = mqtt_throughput(broker, seconds)
        ages = mqtt_age(broker, seconds)
    finally:
        broker.stop()
    ratio = statistics.median(ratios)
    ages.sort()
    metrics = {
        "fps_ratio_with_sinks": round(ratio, 3),
        "round_ratios": [round(r, 3) for r in sorted(ratios)],
        "webhook_deliveries": delivered,
        "mqtt_messages_per_s": round(rate, 1),
        "mqtt_age_p50_ms": round(ages[len(ages) // 2], 2) if ages else None,
        "mqtt_age_p99_ms": round(ages[int(len(ages) * 0.99)], 2) if ages else None,
        "mqtt_age_messages": len(ages),
    }
    targets = {"fps_ratio_with_sinks": f">= {TARGET_RATIO}"}
    report("sink_overhead", metrics, targets, {"fps_ratio_with_sinks": ratio >= TARGET_RATIO})


if __name__ == "__main__":
    sys.exit(main())
