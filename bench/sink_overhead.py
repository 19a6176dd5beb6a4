"""Outputs under load: what MQTT (QoS 1) and a webhook on every frame cost a stream, where
that cost goes, and what one MQTT sink sustains to a local broker.

1. Stream cost: one stream, the bundled clip as a file source with `pace: fast`, the
   person detector. Two arms, `plain` (no sinks) and `sinks` (every result offered to an
   MQTT sink at QoS 1, to a real mosquitto, and to a webhook, to a real aiohttp receiver
   in a process of its own), alternating in one run with the order rotating each round
   (bench/_compare.py). A round's ratio is its sinks fps ÷ its plain fps; the figure is
   their median with a bootstrap 95 % interval, met when the interval's lower bound is
   >= 0.97. Each run is measured over a window of frames after a warm-up, and for that
   window also: the CPU each thread of the appliance spent per frame (/proc schedstat,
   by thread name: bench/_crossover.py), the CPU of the broker and of the receiver per
   frame (on this machine they share the stream's cores), and, from the run's own
   Chrome trace, the mean `session.run`, `workflow.run` and the worker's time between
   two workflow runs (where it publishes the result and takes the next frame).
2. Sink throughput: results offered to one MQTT sink as fast as it takes them; the
   messages per second the broker acknowledges; and, offered at a camera's 30 Hz, the
   age each message has when a subscriber receives it (offer -> broker -> subscriber:
   what the sink adds to a frame's age), p50 and p99.

Needs `mosquitto` (Debian; `sh tests/install_deps.sh` installs it).
"""

from __future__ import annotations

import sys
from pathlib import Path

# Run as `python bench/sink_overhead.py` (bench/ first on the path, for `_common`): the repo
# root next, for the appliance and the tests' broker and receiver.
sys.path.insert(1, str(Path(__file__).resolve().parent.parent))

import contextlib
import gzip
import itertools
import json
import os
import shutil
import statistics
import subprocess
import threading
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import paho.mqtt.client as mqtt
from _common import ROOT, parse_args, report
from _compare import alternate, judge, method, ratios
from _crossover import thread_cpu_ns
from paho.mqtt.enums import CallbackAPIVersion

from appliance.config import parse_config
from appliance.runtime.runtime import Runtime
from pipelines.types import FrameResult
from sinks.mqtt.config import MqttConfig
from sinks.mqtt.sink import MqttSink
from tests.sinks.conftest import Broker, free_port
from tests.sinks.receiver import LoopThread
from tests.support.appliance import DEMO_CLIP, detect_workflow, person_model

TARGET_RATIO = 0.97
ARMS = ("plain", "sinks")  # the baseline first
WARMUP = 20  # frames of a run before its window: the model and the sinks' connections warm
AGE_RATE_HZ = 30.0  # a camera's rate: the age a message has at the subscriber, unqueued
# Threads by name (bench/_crossover.py drops the `:stream` suffix), as the report groups them.
KINDS = {"work": "work", "batch": "batch", "native": "native", "grab": "grab", "sinks": "sinks"}
SINK_PATH = ("work", "sinks", "paho")  # the worker offers, the loop sends, paho's thread acks
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


@dataclass
class Run:
    """One run of one arm, over its window of frames."""

    fps: float
    cpu_ms: dict[str, float]  # CPU ms per frame: the appliance's threads by kind, and peers
    trace_ms: dict[str, float]  # means from the run's trace, ms


class Window:
    """A subscriber that notes the time, every thread's CPU and the peers' CPU at the
    window's first and last frame (on the worker thread: the run is live at both)."""

    def __init__(self, first: int, last: int, peers: dict[str, int]) -> None:
        self.first, self.last, self.peers = first, last, peers
        self.count = 0
        self.marks: list[tuple[float, float, dict[str, int], dict[str, int]]] = []

    def __call__(self, _result: FrameResult) -> None:
        self.count += 1
        if self.count in (self.first, self.last):
            peers = {name: process_cpu_ns(pid) for name, pid in self.peers.items()}
            self.marks.append((time.perf_counter(), time.time(), thread_cpu_ns(), peers))

    def cpu_ms(self) -> dict[str, float]:
        """CPU ms per frame in the window, by kind of thread, then each peer's."""
        (_, _, threads0, peers0), (_, _, threads1, peers1) = self.marks
        frames = self.last - self.first
        out: dict[str, float] = {}
        for name, ns in threads1.items():
            kind = "paho" if name.startswith("paho-mqtt") else KINDS.get(name, "other")
            out[kind] = out.get(kind, 0.0) + (ns - threads0.get(name, 0)) / 1e6 / frames
        for name, ns in peers1.items():
            out[name] = (ns - peers0[name]) / 1e6 / frames
        return out


def process_cpu_ns(pid: int) -> int:
    """CPU ns of every thread of a live process (/proc schedstat: the resolution a peer's
    fraction of a millisecond per frame needs; psutil's counts 10 ms ticks)."""
    total = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(OSError, IndexError):  # a thread that ended meanwhile
            total += int((task / "schedstat").read_text().split()[0])
    return total


def stream_run(frames: int, sinks: dict[str, Any], folder: Path, peers: dict[str, int]) -> Run:
    traces = folder / "traces"
    shutil.rmtree(traces, ignore_errors=True)  # this run's trace only
    stream = {"id": "bench", "workflow": detect_workflow(), "outputs": list(sinks),
              "source": {"url": str(DEMO_CLIP), "pace": "fast", "loop": True}}  # fmt: skip
    # BENCH_SESSION: session options to try (JSON), as bench/_reference.py takes them.
    model = {**person_model(), "session": json.loads(os.environ.get("BENCH_SESSION", "{}"))}
    doc = {"models": {"person": model}, "sinks": sinks, "streams": [stream],
           "profiling": {"dir": str(traces)}}  # fmt: skip
    runtime = Runtime(parse_config(doc, folder), max_frames=frames)
    window = Window(WARMUP, frames, peers)
    runtime.outputs.subscribe(window, "bench")
    runtime.start()
    try:
        if not runtime.wait_done(timeout=600):
            raise SystemExit("the run did not finish")
    finally:
        runtime.stop()
    (mono0, wall0, _, _), (mono1, wall1, _, _) = window.marks
    fps = (window.last - window.first) / (mono1 - mono0)
    return Run(fps, window.cpu_ms(), trace_means(traces, wall0 * 1e6, wall1 * 1e6))


def trace_means(traces: Path, start_us: float, end_us: float) -> dict[str, float]:
    """From the rolling trace files, in the window (ms): the mean `session.run` (ONNX
    Runtime), `workflow.run` (the worker's run of the workflow, which waits for it), the
    worker's time from one workflow run's end to the next one's start (publishing the
    result, taking the next frame) and the frame interval (run start to run start)."""
    events: list[dict[str, Any]] = []
    for path in sorted(traces.glob("rolling/*.json*")):
        opener = gzip.open if path.suffix == ".gz" else open
        with opener(path, "rt") as f:
            events += json.load(f)["traceEvents"]

    def spans(name: str) -> list[tuple[float, float]]:
        return sorted(
            (e["ts"], e["dur"])
            for e in events
            if e.get("ph") == "X" and e["name"] == name and start_us <= e["ts"] <= end_us
        )

    runs, sessions = spans("workflow.run"), spans("session.run")
    between = [b[0] - (a[0] + a[1]) for a, b in itertools.pairwise(runs)]
    return {
        "session_run": statistics.mean(d for _, d in sessions) / 1000,
        "workflow_run": statistics.mean(d for _, d in runs) / 1000,
        "worker_between_runs": statistics.mean(between) / 1000,
        "frame": (runs[-1][0] - runs[0][0]) / (len(runs) - 1) / 1000,
    }


def stream_cost(
    rounds: int, frames: int, broker: Broker, hook: str, peers: dict[str, int]
) -> dict[str, list[Run]]:
    sinks = {"bus": {"type": "mqtt", "port": broker.port, "qos": 1, "client_id": "bench-bus"},
             "hook": {"type": "webhook", "url": hook, "secret": "bench"}}  # fmt: skip
    configs = {"plain": {}, "sinks": sinks}
    runs: dict[str, list[Run]] = {arm: [] for arm in ARMS}
    folder = ROOT / "bench" / ".work" / "sink_overhead"

    def arm(name: str) -> Any:
        def measure() -> float:
            runs[name].append(stream_run(frames, configs[name], folder / name, peers))
            return runs[name][-1].fps

        return measure

    def progress(r: int, fps: dict[str, list[float]]) -> None:
        plain, sinks = runs["plain"][-1], runs["sinks"][-1]
        cost = {k: round(sinks.cpu_ms.get(k, 0.0) - plain.cpu_ms.get(k, 0.0), 2)
                for k in (*SINK_PATH, *peers)}  # fmt: skip
        print(f"round {r + 1}: no sinks {plain.fps:.1f} fps, MQTT + webhook {sinks.fps:.1f} "
              f"fps; CPU ms per frame added {cost}", flush=True)  # fmt: skip

    alternate({name: arm(name) for name in ARMS}, rounds, progress)
    return runs


def medians(runs: list[Run], field: str) -> dict[str, float]:
    keys = sorted({k for run in runs for k in getattr(run, field)})
    return {k: round(statistics.median(getattr(r, field).get(k, 0.0) for r in runs), 3)
            for k in keys}  # fmt: skip


def added(plain: list[Run], with_sinks: list[Run], field: str) -> dict[str, float]:
    """What the sinks added to each of a run's `field` (cpu_ms, trace_ms): the median over
    the rounds of each round's sinks run minus its plain run (paired, as the ratios are)."""
    keys = sorted({k for run in (*plain, *with_sinks) for k in getattr(run, field)})
    return {
        k: round(statistics.median(getattr(s, field).get(k, 0.0) - getattr(p, field).get(k, 0.0)
                                   for p, s in zip(plain, with_sinks, strict=True)), 3)
        for k in keys
    }  # fmt: skip


def result(seq: int) -> FrameResult:
    now, mono = time.time(), time.perf_counter()
    image = np.zeros((4, 4, 3), np.uint8)
    people = {"in": seq, "out": 0, "total": seq}
    return FrameResult("bench", seq, None, now, mono, mono, mono, image, {"crossings": people})


@contextlib.contextmanager
def receiver() -> Iterator[tuple[str, int]]:
    """The receiver's URL and process id."""
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
        yield url, proc.pid
    finally:
        proc.terminate()
        proc.wait(10)


def deliveries(url: str) -> int:
    with urllib.request.urlopen(url + "/count", timeout=5) as resp:
        return int(json.load(resp))


def mqtt_sink(broker: Broker, loop: LoopThread) -> MqttSink:
    cfg = MqttConfig.model_validate({"type": "mqtt", "port": broker.port, "qos": 1,
                                     "client_id": "bench-pub",
                                     "queue": {"max_messages": 1000}})  # fmt: skip
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
    rounds, frames, seconds = (3, 100, 5.0) if args.quick else (9, 400, 15.0)
    folder = ROOT / "bench" / ".work"
    folder.mkdir(parents=True, exist_ok=True)
    broker = Broker(free_port(), folder)
    broker.start()
    try:
        with receiver() as (hook, receiver_pid):
            assert broker.proc is not None
            peers = {"receiver": receiver_pid, "broker": broker.proc.pid}
            runs = stream_cost(rounds, frames, broker, hook + "/hook", peers)
            delivered = deliveries(hook)
        rate = mqtt_throughput(broker, seconds)
        ages = mqtt_age(broker, seconds)
    finally:
        broker.stop()
    plain, with_sinks = runs["plain"], runs["sinks"]
    per_round = ratios([r.fps for r in with_sinks], [r.fps for r in plain])
    verdict = judge(per_round, at_least=TARGET_RATIO)
    cpu = {"plain": medians(plain, "cpu_ms"), "sinks": medians(with_sinks, "cpu_ms")}
    more = added(plain, with_sinks, "cpu_ms")
    trace = {"plain": medians(plain, "trace_ms"), "sinks": medians(with_sinks, "trace_ms")}
    ages.sort()
    metrics = {
        "fps_ratio_with_sinks": round(verdict.median, 3),
        "fps_ratio_with_sinks_ci95": [round(verdict.low, 3), round(verdict.high, 3)],
        "round_ratios": [round(r, 3) for r in per_round],
        "fps_plain": round(statistics.median(r.fps for r in plain), 1),
        "fps_sinks": round(statistics.median(r.fps for r in with_sinks), 1),
        "frames_per_run": frames - WARMUP,
        # CPU ms per frame by thread (and of the broker and the receiver, which share the
        # cores here): medians over the rounds, and what the sinks added.
        "cpu_ms_per_frame": {**cpu, "added": more},
        # The threads that do the sinks' work; ONNX Runtime's (batch, native) are left
        # out: what they add is their spinning while slowed, not work for the sinks.
        "cpu_ms_added_sink_path": round(sum(more.get(k, 0.0) for k in SINK_PATH), 3),
        "cpu_ms_added_peers": round(sum(more.get(k, 0.0) for k in peers), 3),
        "trace_ms": {**trace, "added": added(plain, with_sinks, "trace_ms")},
        "webhook_deliveries": delivered,
        "mqtt_messages_per_s": round(rate, 1),
        "mqtt_age_p50_ms": round(ages[len(ages) // 2], 2) if ages else None,
        "mqtt_age_p99_ms": round(ages[int(len(ages) * 0.99)], 2) if ages else None,
        "mqtt_age_messages": len(ages),
    }
    targets = {"fps_ratio_with_sinks": f">= {TARGET_RATIO} (95 % interval's lower bound)"}
    how = method(
        "one stream's fps with MQTT (QoS 1) and a webhook on every result, against the "
        "same stream without sinks",
        ARMS,
        rounds,
        f"one Runtime per arm in this process, {frames} frames of the bundled clip with "
        f"pace: fast, fps and CPU over frames {WARMUP}-{frames}; a round's ratio is "
        "sinks ÷ plain",
        baseline="plain",
        cpu="per thread of this process from /proc schedstat (bench/_crossover.py), and the "
        "broker's and the receiver's processes, ms per frame in the window",
        trace="the run's own rolling Chrome trace, the spans in the window",
    )
    met = {"fps_ratio_with_sinks": verdict.met}
    verdicts = {"fps_ratio_with_sinks": verdict.as_json()}
    report("sink_overhead", metrics, targets, met, method=how, verdicts=verdicts)


if __name__ == "__main__":
    main()
