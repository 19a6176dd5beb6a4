"""Soak: 8 streams for minutes with the demo workflows, sinks and continuous profiling,
while a fault script restarts the camera server and the MQTT broker at intervals.

The appliance is a real `appliance serve` child reading two RTSP cameras (GStreamer
servers playing the demo clip; four streams each), running the people counter and the
privacy blur on alternate streams, publishing every result to a real mosquitto (QoS 1)
and a real webhook receiver, with rolling traces every 10 s kept within 20 MiB (2 MiB
with --quick, so that 50 s already rotate some out). Every 5 s it samples the child's RSS,
threads and open file descriptors and the rolling trace folder's size. The fault script
stops camera A for 3 s every `--camera-every` seconds and the broker for 3 s every
`--broker-every` seconds.

Reported (the curve, every 5 s, in bench/results/soak_curve.json): RSS and threads over
time (growth after warm-up: the last fifth's median ÷ the first post-warm-up fifth's,
target ≤ 1.05), fds, the trace folder's peak size against the bound its retention
settings allow (`trace_bound`), the results lost on the way to the MQTT subscriber and to
the webhook receiver, and the frames the camera outages cost (dropped and not decoded
while reconnecting).

Lost is counted by identity, not by count: the results sent are every (stream, seq)
the appliance processed, read from its own rolling traces (one `workflow.run` span per
result, each file read as it is closed, before the retention removes it); lost = sent −
the set received. A duplicate (QoS 1 redelivers after a broker restart) is counted apart
and can hide no loss. A result received that the traces do not name would mean a trace
file was missed: counted (`results_untraced`, target 0), so the loss count is complete.

    python bench/soak.py [--quick] [--minutes M] [--camera-every S] [--broker-every S]
"""

from __future__ import annotations

import contextlib
import json
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import psutil

from appliance.profiling.config import ProfilingConfig
from bench._common import RESULTS, ROOT, bench_parser, report
from tests.sinks.conftest import Broker, Subscriber
from tests.sinks.receiver import Receiver
from tests.support.clock_camera import DEMO_CLIP
from tests.support.processes import free_port
from tests.support.rtsp import RtspServer

SAMPLE_S = 5.0
OUTAGE_S = 3.0
KEEP_BYTES = 20 * 1024 * 1024
QUICK_KEEP_BYTES = 2 * 1024 * 1024  # 1-3 files of 8 streams: 50 s rotate some out
ROTATE_S = 10.0
GROWTH_TARGET = 1.05
CAMERA_FPS = 15  # the demo clip's rate
POLL_S = 1.0  # the trace reader's period: far under a file's life (>= one rotate_s)


def trace_bound(profiling: ProfilingConfig, largest_file: int) -> int:
    """The most bytes the rolling folder can hold at any moment, by the writer's
    retention (appliance/profiling/rolling.py, `_retain`), given its largest file.

    Closed files: the newest ones within `keep_files` files and `keep_bytes` bytes,
    except that the newest is kept even alone over `keep_bytes`. Plus one file the
    retention does not count: the period being written (`.tmp`), or the file just closed
    before the retention ran. No setting caps one file: it holds one `rotate_s` of
    events, so the largest file the run wrote (`.tmp` included) stands for it.

    Units, for the full run: keep_bytes = 20 MiB = 20.97 MB; a 10-s file of 8 streams
    is about 1.4 MB (the 600-s run peaked 1.41 MB over keep_bytes, so its largest file
    was at least that), and keep_files 60 × 1.4 MB = 84 MB: keep_bytes binds, and the
    bound is about 20.97 + 1.4 = 22.4 MB. With --quick on a busy 2-core machine:
    2 MiB = 2.10 MB, 0.69-MB files, 60 × 0.69 = 41 MB, so the bound is 2.10 + 0.69 =
    2.79 MB (peak seen: 2.09 MB). A folder holding one file more than the retention
    allows is over the bound and fails the check (seen by computing the bound from a
    smaller keep_bytes than the appliance ran with)."""
    closed = max(min(profiling.keep_bytes, profiling.keep_files * largest_file), largest_file)
    return closed + largest_file


class TraceLog(threading.Thread):
    """Reads every rolling trace as it is closed, before the retention removes it: the
    (stream, seq) of each result the appliance processed (its `workflow.run` spans), and
    the largest trace file seen, `.tmp` included."""

    def __init__(self, rolling: Path) -> None:
        super().__init__(name="trace-log", daemon=True)
        self.rolling = rolling
        self.sent: set[tuple[str, int]] = set()
        self.largest = 0
        self.missed: list[str] = []  # closed files gone before they were read
        self.stop_event = threading.Event()
        self._read: set[str] = set()
        self._lock = threading.Lock()

    def run(self) -> None:
        while not self.stop_event.wait(POLL_S):
            self.poll()

    def poll(self) -> None:
        """Read the closed files not read yet (once more after the child's exit)."""
        with self._lock:
            for path in sorted(self.rolling.glob("trace-*")):
                try:
                    self.largest = max(self.largest, path.stat().st_size)
                    if path.name.endswith(".json") and path.name not in self._read:
                        self._take(json.loads(path.read_bytes()))
                        self._read.add(path.name)
                except FileNotFoundError:  # renamed or removed since the listing
                    if path.name.endswith(".json") and path.name not in self._read:
                        self.missed.append(path.name)

    def _take(self, doc: dict[str, Any]) -> None:
        for event in doc["traceEvents"]:
            if event.get("name") == "workflow.run":
                self.sent.add((str(event["args"]["stream"]), int(event["args"]["seq"])))


def config(
    cameras: list[str], broker: Broker, hook: str, tmp: Path, keep_bytes: int
) -> dict[str, Any]:
    workflows = [ROOT / "configs/workflows/people_counter.yaml",
                 ROOT / "configs/workflows/privacy_blur.yaml"]  # fmt: skip
    fast = {"stall_timeout_s": 3, "open_timeout_s": 3, "backoff": {"initial_s": 0.2, "max_s": 1}}
    bus = {"type": "mqtt", "port": broker.port, "qos": 1, "client_id": "soak",
           "queue": {"max_messages": 100000}}  # fmt: skip

    def stream(i: int) -> dict[str, Any]:
        return {"id": f"cam{i}", "source": {"url": cameras[i % 2], **fast},
                "workflow": str(workflows[i % 2]), "outputs": ["bus", "hook"]}  # fmt: skip

    return {
        "profiling": {"dir": str(tmp / "traces"), "rotate_s": ROTATE_S, "keep_bytes": keep_bytes},
        "sinks": {"bus": bus, "hook": {"type": "webhook", "url": hook}},
        "streams": [stream(i) for i in range(8)],
    }


def get(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=10) as resp:
        return json.loads(resp.read())


def folder_bytes(folder: Path) -> int:
    total = 0
    for path in folder.rglob("*"):
        with contextlib.suppress(FileNotFoundError):  # removed by the retention meanwhile
            total += path.stat().st_size if path.is_file() else 0
    return total


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
            "trace_mb": folder_bytes(traces / "rolling") / 1e6,
        }


def growth(samples: list[dict[str, float]], key: str, warmup_s: float) -> float:
    after = [s[key] for s in samples if s["t"] >= warmup_s]
    fifth = max(1, len(after) // 5)
    return statistics.median(after[-fifth:]) / statistics.median(after[:fifth])


@dataclass(frozen=True)
class Plan:
    """What one soak run does."""

    seconds: float
    warmup_s: float
    camera_every: float
    broker_every: float
    keep_bytes: int
    quick: bool


def main() -> None:
    parser = bench_parser(__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--camera-every", type=float, default=60.0)
    parser.add_argument("--broker-every", type=float, default=90.0)
    args = parser.parse_args()
    seconds = 50.0 if args.quick else args.minutes * 60
    camera_every, broker_every = (15.0, 25.0) if args.quick else (args.camera_every,
                                                                  args.broker_every)  # fmt: skip
    keep = QUICK_KEEP_BYTES if args.quick else KEEP_BYTES
    plan = Plan(seconds, min(60.0, seconds / 5), camera_every, broker_every, keep, args.quick)
    with tempfile.TemporaryDirectory(prefix="bench-soak-") as name:
        metrics, targets, met, verdicts = soak(Path(name), plan)
    report("soak", metrics, targets, met, method=method(plan), verdicts=verdicts)


def method(plan: Plan) -> dict[str, Any]:
    return {
        "what": "`appliance serve`, 8 streams of two RTSP cameras (the demo clip), the "
        "people counter and the privacy blur on alternate streams, every result to "
        "mosquitto (QoS 1, a persistent-session subscriber) and a webhook receiver, "
        "rolling traces; camera A and the broker stopped for "
        f"{OUTAGE_S:g} s every {plan.camera_every:g} s and {plan.broker_every:g} s",
        "rounds": 1,
        "round": f"{plan.seconds:g} s, sampled every {SAMPLE_S:g} s after the appliance "
        f"is ready; growth judged after a {plan.warmup_s:g}-s warm-up",
        "figure": "growth: the last fifth's median sample ÷ the first post-warm-up "
        "fifth's; lost: the (stream, seq) the traces name as processed minus those "
        "received (duplicates counted apart); trace folder: its peak over the samples",
        "verdict": "one run, each figure judged as it is (no interval): counts must be 0, "
        "growth and the trace folder within their bounds",
        "profiling": {"rotate_s": ROTATE_S, "keep_bytes": plan.keep_bytes},
    }


def soak(
    tmp: Path, plan: Plan
) -> tuple[dict[str, Any], dict[str, Any], dict[str, bool], dict[str, Any]]:
    cams = [RtspServer(["--clip", str(DEMO_CLIP)], free_port(), "/demo", tmp / f"cam{i}.log")
            for i in range(2)]  # fmt: skip
    (tmp / "broker").mkdir()
    broker = Broker(free_port(), tmp / "broker")
    parts: list[RtspServer | Broker] = [*cams, broker]
    for part in parts:
        part.start()
    receiver = Receiver().__enter__()
    subscriber = Subscriber(broker, ["appliance/#"])  # results and states: all it sends
    doc = config([c.url for c in cams], broker, receiver.url, tmp, plan.keep_bytes)
    cfg = tmp / "config.yaml"
    cfg.write_text(json.dumps(doc))
    port = free_port()
    log = (tmp / "serve.log").open("w")
    child = subprocess.Popen(
        [sys.executable, "-m", "appliance", "--log-level", "WARNING", "serve", "--config",
         str(cfg), "--port", str(port), "--stats-interval", "600"],
        stdout=log, stderr=subprocess.STDOUT,
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    faults = Faults(cams[0], broker, plan.camera_every, plan.broker_every)
    traces = TraceLog(tmp / "traces" / "rolling")
    samples: list[dict[str, float]] = []
    try:
        _wait_ready(url, child)
        proc, t0 = psutil.Process(child.pid), time.monotonic()
        faults.start()
        traces.start()
        while time.monotonic() - t0 < plan.seconds:
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
        traces.stop_event.set()
        traces.join(10)
        traces.poll()  # the last period, written at the exit
        log.close()
        subscriber.close()
        receiver.__exit__(None, None, None)
        for part in parts:
            part.stop()
    profiling = ProfilingConfig.model_validate(doc["profiling"])
    seen = Seen(traces, subscriber, receiver, trace_bound(profiling, traces.largest))
    curve = [{k: round(v, 1) for k, v in s.items()} for s in samples]
    folder = RESULTS / "quick" if plan.quick else RESULTS  # a quick run keeps the full curve
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "soak_curve.json").write_text(json.dumps(curve, indent=1) + "\n")
    return _figures(samples, plan, streams, sinks, seen, faults)


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


def result_id(body: bytes) -> tuple[str, int] | None:
    """(stream, seq) of a delivered result; None for anything else (states, events)."""
    doc = json.loads(body)
    if not isinstance(doc, dict) or "seq" not in doc or "stream" not in doc:
        return None
    return str(doc["stream"]), int(doc["seq"])


class Seen:
    """What was sent (the traces' results) against what arrived, by identity."""

    def __init__(
        self, traces: TraceLog, subscriber: Subscriber, receiver: Receiver, bound: int
    ) -> None:
        self.sent, self.traces, self.trace_bound = traces.sent, traces, bound
        # Retained copies come again on each resubscription (after a broker restart): not
        # new; the status topics carry states, not results.
        self.mqtt_messages = [m for m in subscriber.messages if not m.retain]
        self.mqtt = self._ids([m.payload for m in self.mqtt_messages
                               if m.topic.endswith("/predictions")])  # fmt: skip
        self.hook = self._ids([r.body for r in receiver.requests])
        self.hook_requests = len(receiver.requests)

    @staticmethod
    def _ids(bodies: list[bytes]) -> list[tuple[str, int]]:
        return [i for i in map(result_id, bodies) if i is not None]

    def figures(self, sinks: dict[str, Any]) -> dict[str, Any]:
        mqtt, hook = set(self.mqtt), set(self.hook)
        return {
            "results_sent": len(self.sent),
            "results_untraced": len((mqtt | hook) - self.sent),
            "trace_files_missed": len(self.traces.missed),
            "mqtt_sent": sinks["bus"]["sent"], "mqtt_received": len(self.mqtt_messages),
            "mqtt_results_received": len(mqtt),
            "mqtt_lost": len(self.sent - mqtt),
            "mqtt_duplicates": len(self.mqtt) - len(mqtt),
            "webhook_sent": sinks["hook"]["sent"], "webhook_received": self.hook_requests,
            "webhook_results_received": len(hook),
            "webhook_lost": len(self.sent - hook),
            "webhook_duplicates": len(self.hook) - len(hook),
            "webhook_dead_lettered": sinks["hook"].get("dead_lettered", 0),
        }  # fmt: skip


def _figures(
    samples: list[dict[str, float]], plan: Plan, streams: list[dict[str, Any]],
    sinks: dict[str, Any], seen: Seen, faults: Faults,
) -> tuple[dict[str, Any], dict[str, Any], dict[str, bool], dict[str, Any]]:  # fmt: skip
    downtime = sum(_downtime(s) for s in streams)
    metrics: dict[str, Any] = {
        "seconds": plan.seconds,
        "camera_outages": sum(1 for _, w in faults.log if w == "camera"),
        "broker_outages": sum(1 for _, w in faults.log if w == "broker"),
        "rss_mb_start": samples[0]["rss_mb"], "rss_mb_end": samples[-1]["rss_mb"],
        "rss_growth_after_warmup": growth(samples, "rss_mb", plan.warmup_s),
        "threads_growth_after_warmup": growth(samples, "threads", plan.warmup_s),
        "threads_max": max(s["threads"] for s in samples),
        "fds_start": samples[0]["fds"], "fds_max": max(s["fds"] for s in samples),
        "fds_end": samples[-1]["fds"],
        "trace_mb_max": max(s["trace_mb"] for s in samples),
        "trace_keep_mb": plan.keep_bytes / 1e6,
        "trace_file_mb_max": seen.traces.largest / 1e6,
        "trace_mb_bound": seen.trace_bound / 1e6,
        "frames_processed": sum(s["frames_processed"] for s in streams),
        "frames_dropped": sum(s["frames_dropped"] for s in streams),
        "reconnects": sum(s["reconnects"] for s in streams),
        # Frames lost to the camera outages: each stream's time out of `running` after it
        # first ran (from its transitions) at the camera's 15 fps.
        "stream_downtime_s": round(downtime, 1),
        "frames_lost_to_outages": round(downtime * CAMERA_FPS),
        **seen.figures(sinks),
    }  # fmt: skip
    m, growth_rule = metrics, f"met when the one run's growth <= {GROWTH_TARGET}"
    same = "a set difference: duplicates hide nothing"
    checks = {  # target, rule, met: one run, each figure judged as it is (no interval)
        "rss_growth_after_warmup": (f"<= {GROWTH_TARGET}", growth_rule,
                                    m["rss_growth_after_warmup"] <= GROWTH_TARGET),
        "threads_growth_after_warmup": (f"<= {GROWTH_TARGET}", growth_rule,
                                        m["threads_growth_after_warmup"] <= GROWTH_TARGET),
        "trace_mb_max": ("<= trace_mb_bound", "met when the folder's peak over every sample "
                         "<= trace_mb_bound: closed files within keep_files and keep_bytes "
                         "(the newest kept even alone over it) plus the file being written, "
                         "which no setting caps: the run's largest",
                         m["trace_mb_max"] <= m["trace_mb_bound"]),
        "mqtt_lost": ("0", f"met when every result the traces name reached the subscriber "
                      f"({same})", m["mqtt_lost"] == 0),
        "webhook_lost": ("0", f"met when every result the traces name reached the receiver "
                         f"({same})", m["webhook_lost"] == 0),
        "results_untraced": ("0", "met when the traces name every result received: no trace "
                             "file was missed, so the lost counts are complete",
                             m["results_untraced"] == 0),
    }  # fmt: skip
    targets = {k: target for k, (target, _, _) in checks.items()}
    met = {k: ok for k, (_, _, ok) in checks.items()}
    verdicts = {k: {"value": m[k], "rounds": 1, "target": target, "rule": rule, "met": ok}
                for k, (target, rule, ok) in checks.items()}  # fmt: skip
    return metrics, targets, met, verdicts


if __name__ == "__main__":
    main()
