"""Soak: 8 streams for minutes with the demo workflows, sinks and continuous profiling,
while a fault script restarts the camera server and the MQTT broker at intervals.

The appliance is a real `appliance serve` child reading two RTSP cameras (GStreamer
servers playing the demo clip; four streams each), running the people counter and the
privacy blur on alternate streams, publishing every result to a real mosquitto (QoS 1)
and a real webhook receiver, with rolling traces every 10 s kept within 20 MB. Every 5 s
it samples the child's RSS, threads and open file descriptors and the trace folder's
size. The fault script stops camera A for 3 s every `--camera-every` seconds and the
broker for 3 s every `--broker-every` seconds.

Reported (the curve, every 5 s, in bench/results/soak_curve.json): RSS and threads over
time (growth after warm-up: the last fifth's median ÷ the first post-warm-up fifth's,
target ≤ 1.05), fds, the trace folder's peak size
against its retention, MQTT messages the appliance counted as sent that the subscriber
never saw (target 0: QoS 1 with persistent sessions), webhook deliveries lost, and the
frames the camera outages cost (dropped and not decoded while reconnecting).

    python bench/soak.py [--quick] [--minutes M] [--camera-every S] [--broker-every S]
"""

from __future__ import annotations

import json
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import psutil

from bench._common import RESULTS, ROOT, bench_parser, report
from tests.sinks.conftest import Broker, Subscriber
from tests.sinks.receiver import Receiver
from tests.support.clock_camera import DEMO_CLIP
from tests.support.processes import free_port
from tests.support.rtsp import RtspServer

SAMPLE_S = 5.0
OUTAGE_S = 3.0
KEEP_BYTES = 20 * 1024 * 1024
GROWTH_TARGET = 1.05
CAMERA_FPS = 15  # the demo clip's rate


def config(cameras: list[str], broker: Broker, hook: str, tmp: Path) -> dict[str, Any]:
    workflows = [ROOT / "configs/workflows/people_counter.yaml",
                 ROOT / "configs/workflows/privacy_blur.yaml"]  # fmt: skip
    fast = {"stall_timeout_s": 3, "open_timeout_s": 3, "backoff": {"initial_s": 0.2, "max_s": 1}}
    bus = {"type": "mqtt", "port": broker.port, "qos": 1, "client_id": "soak",
           "queue": {"max_messages": 100000}}  # fmt: skip

    def stream(i: int) -> dict[str, Any]:
        return {"id": f"cam{i}", "source": {"url": cameras[i % 2], **fast},
                "workflow": str(workflows[i % 2]), "outputs": ["bus", "hook"]}  # fmt: skip

    return {
        "profiling": {"dir": str(tmp / "traces"), "rotate_s": 10, "keep_bytes": KEEP_BYTES},
        "sinks": {"bus": bus, "hook": {"type": "webhook", "url": hook}},
        "streams": [stream(i) for i in range(8)],
    }


def get(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=10) as resp:
        return json.loads(resp.read())


def folder_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())


class Faults(threading.Thread):
    """Stops camera A and the broker for OUTAGE_S, each on its own period."""

    def __init__(self, camera: RtspServer, broker: Broker, camera_every: float,
                 broker_every: float) -> None:  # fmt: skip
        super().__init__(name="faults", daemon=True)
        self.camera, self.broker = camera, broker
        self.periods = {"camera": camera_every, "broker": broker_every}
        self.stop_event = threading.Event()
        self.log: list[tuple[float, str]] = []

    def run(self) -> None:
        start = time.monotonic()
        due = {k: start + v for k, v in self.periods.items()}
        while not self.stop_event.wait(0.2):
            now = time.monotonic()
            for what, when in due.items():
                if now >= when:
                    self._outage(what)
                    self.log.append((now - start, what))
                    due[what] = time.monotonic() + self.periods[what]

    def _outage(self, what: str) -> None:
        part = self.camera if what == "camera" else self.broker
        part.stop()
        time.sleep(OUTAGE_S)
        part.start()


def sample(proc: psutil.Process, traces: Path, t0: float) -> dict[str, float]:
    with proc.oneshot():
        return {
            "t": time.monotonic() - t0,
            "rss_mb": proc.memory_info().rss / 1e6,
            "threads": proc.num_threads(),
            "fds": proc.num_fds(),
            "trace_mb": folder_bytes(traces) / 1e6,
        }


def growth(samples: list[dict[str, float]], key: str, warmup_s: float) -> float:
    after = [s[key] for s in samples if s["t"] >= warmup_s]
    fifth = max(1, len(after) // 5)
    return statistics.median(after[-fifth:]) / statistics.median(after[:fifth])


def main() -> None:
    parser = bench_parser(__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--camera-every", type=float, default=60.0)
    parser.add_argument("--broker-every", type=float, default=90.0)
    args = parser.parse_args()
    seconds = 50.0 if args.quick else args.minutes * 60
    camera_every, broker_every = (15.0, 25.0) if args.quick else (args.camera_every,
                                                                  args.broker_every)  # fmt: skip
    warmup = min(60.0, seconds / 5)
    with tempfile.TemporaryDirectory(prefix="bench-soak-") as name:
        tmp = Path(name)
        figures = soak(tmp, seconds, warmup, camera_every, broker_every)
    report("soak", *figures)


def soak(
    tmp: Path, seconds: float, warmup: float, camera_every: float, broker_every: float
) -> tuple[dict[str, Any], dict[str, Any], dict[str, bool]]:
    cams = [RtspServer(["--clip", str(DEMO_CLIP)], free_port(), "/demo", tmp / f"cam{i}.log")
            for i in range(2)]  # fmt: skip
    (tmp / "broker").mkdir()
    broker = Broker(free_port(), tmp / "broker")
    for part in (*cams, broker):
        part.start()
    receiver = Receiver().__enter__()
    subscriber = Subscriber(broker, ["appliance/#"])  # results and states: all it sends
    cfg = tmp / "config.yaml"
    cfg.write_text(json.dumps(config([c.url for c in cams], broker, receiver.url, tmp)))
    port = free_port()
    log = (tmp / "serve.log").open("w")
    child = subprocess.Popen(
        [sys.executable, "-m", "appliance", "--log-level", "WARNING", "serve", "--config",
         str(cfg), "--port", str(port), "--stats-interval", "600"],
        stdout=log, stderr=subprocess.STDOUT,
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    faults = Faults(cams[0], broker, camera_every, broker_every)
    samples: list[dict[str, float]] = []
    try:
        _wait_ready(url, child)
        proc, t0 = psutil.Process(child.pid), time.monotonic()
        faults.start()
        while time.monotonic() - t0 < seconds:
            samples.append(sample(proc, tmp / "traces", t0))
            print(f"{samples[-1]['t']:6.0f} s  rss {samples[-1]['rss_mb']:6.1f} MB  threads "
                  f"{samples[-1]['threads']:3.0f}  fds {samples[-1]['fds']:3.0f}  traces "
                  f"{samples[-1]['trace_mb']:5.1f} MB", flush=True)  # fmt: skip
            time.sleep(SAMPLE_S)
        faults.stop_event.set()
        faults.join(OUTAGE_S + 10)
        streams = get(url + "/v1/streams")["streams"]
        sinks = _drained(url, [s["id"] for s in streams])
    finally:
        child.send_signal(signal.SIGTERM)
        child.wait(30)
        log.close()
        subscriber.close()
        receiver.__exit__(None, None, None)
        for part in (*cams, broker):
            part.stop()
    return _figures(samples, warmup, streams, sinks, subscriber, receiver, faults, seconds)


def _drained(url: str, stream_ids: list[str]) -> dict[str, Any]:
    """Every stream removed (no more results), then the sinks' queues emptied: their
    counters are final, and what they sent can be compared with what arrived."""
    for stream_id in stream_ids:
        request = urllib.request.Request(f"{url}/v1/streams/{stream_id}", method="DELETE")
        urllib.request.urlopen(request, timeout=10).close()
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        sinks = {s["name"]: s for s in get(url + "/v1/sinks")["sinks"]}
        if all(s["queue_depth"] == 0 for s in sinks.values()):
            break
        time.sleep(0.5)
    time.sleep(3.0)  # the last ones reach the subscriber and the receiver
    return {s["name"]: s for s in get(url + "/v1/sinks")["sinks"]}


def _downtime(stream: dict[str, Any]) -> float:
    """Seconds the stream spent out of `running` after it first ran, by its transitions
    (the newest 50: enough for one outage a minute over the soak)."""
    down, left = 0.0, None
    ran = False
    for t in sorted(stream["transitions"], key=lambda t: t["time"]):
        if t["state"] == "running":
            if left is not None:
                down += t["time"] - left
            ran, left = True, None
        elif ran and left is None:
            left = t["time"]
    return down


def _wait_ready(url: str, child: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and child.poll() is None:
        try:
            if get(url + "/ready")["ready"]:
                return
        except OSError:
            pass
        time.sleep(0.5)
    raise RuntimeError("the appliance did not get ready")


def _figures(
    samples: list[dict[str, float]], warmup: float, streams: list[dict[str, Any]],
    sinks: dict[str, Any], subscriber: Subscriber, receiver: Receiver, faults: Faults,
    seconds: float,
) -> tuple[dict[str, Any], dict[str, Any], dict[str, bool]]:  # fmt: skip
    # Retained copies come again on each resubscription (after a broker restart): not new.
    received = sum(1 for m in subscriber.messages if not m.retain)
    delivered = len(receiver.requests)
    metrics: dict[str, Any] = {
        "seconds": seconds,
        "camera_outages": sum(1 for _, w in faults.log if w == "camera"),
        "broker_outages": sum(1 for _, w in faults.log if w == "broker"),
        "rss_mb_start": samples[0]["rss_mb"], "rss_mb_end": samples[-1]["rss_mb"],
        "rss_growth_after_warmup": growth(samples, "rss_mb", warmup),
        "threads_growth_after_warmup": growth(samples, "threads", warmup),
        "threads_max": max(s["threads"] for s in samples),
        "fds_start": samples[0]["fds"], "fds_max": max(s["fds"] for s in samples),
        "fds_end": samples[-1]["fds"],
        "trace_mb_max": max(s["trace_mb"] for s in samples),
        "frames_processed": sum(s["frames_processed"] for s in streams),
        "frames_dropped": sum(s["frames_dropped"] for s in streams),
        "reconnects": sum(s["reconnects"] for s in streams),
        # Frames lost to the camera outages: each stream's time out of `running` after it
        # first ran (from its transitions) at the camera's 15 fps.
        "stream_downtime_s": round(sum(_downtime(s) for s in streams), 1),
        "frames_lost_to_outages": round(sum(_downtime(s) for s in streams) * CAMERA_FPS),
        "mqtt_sent": sinks["bus"]["sent"], "mqtt_received": received,
        "mqtt_lost": max(0, sinks["bus"]["sent"] - received),
        "webhook_sent": sinks["hook"]["sent"], "webhook_received": delivered,
        "webhook_lost": max(0, sinks["hook"]["sent"] - delivered),
        "webhook_duplicates": max(0, delivered - sinks["hook"]["sent"]),
    }  # fmt: skip
    curve = [{k: round(v, 1) for k, v in s.items()} for s in samples]
    (RESULTS / "soak_curve.json").write_text(json.dumps(curve, indent=1) + "\n")
    targets = {
        "rss_growth_after_warmup": f"<= {GROWTH_TARGET}",
        "threads_growth_after_warmup": f"<= {GROWTH_TARGET}",
        "trace_mb_max": f"<= {KEEP_BYTES / 1e6:.0f} + one file",
        "mqtt_lost": "0", "webhook_lost": "0",
    }  # fmt: skip
    met = {
        "rss_growth_after_warmup": metrics["rss_growth_after_warmup"] <= GROWTH_TARGET,
        "threads_growth_after_warmup": metrics["threads_growth_after_warmup"] <= GROWTH_TARGET,
        "trace_mb_max": metrics["trace_mb_max"] <= KEEP_BYTES / 1e6 + 5,
        "mqtt_lost": metrics["mqtt_lost"] == 0,
        "webhook_lost": metrics["webhook_lost"] == 0,
    }
    return metrics, targets, met


if __name__ == "__main__":
    main()
