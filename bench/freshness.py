"""Freshness against the reference: emission → result latency and processed fps, side by side.

The camera is a clock camera (tests/support/clock_camera.py): 640x480 H.264 over RTSP,
every frame stamped with its index, every index's emission time logged as its first RTP
packet leaves. Latency is the truth for both pipelines: result wall time minus the time
the camera emitted that very frame (read back from the result's own pixels).

Pipelines, each in its own child process (bench/_reference.py), both on ONNX Runtime's
CPU provider, both with our model pre- and post-processing (pipelines.decoders):
- ours: the appliance's `Runtime`, results taken from `outputs.subscribe` (the worker
  thread, as soon as the workflow finished);
- ref: Roboflow's InferencePipeline, in a bench-only venv under bench/.work/ created on
  first use (~30 s, needs the package index); results taken in its `on_prediction` sink.
  Without that venv, ours still runs and the reference's figures read "missing".
Rounds alternate the order (ours first, then ref first) so that the machine's slow and
fast spells hit both alike. A round measures a window that starts `warmup` seconds after
every stream produced its first result. Per round: processed fps per stream, the slowest
stream's fps, latency p50/p99, CPU ms per processed frame (utime + stime of the child
from /proc), RSS, the machine's load, and the p50 of each stage: emission → model step
start (`wait`), the model step (`model`), → sink (`sink`), and for ours emission →
decoded (`decode`). Ratios ours/ref per round; the interval is the min–max over rounds
(with n rounds, a distribution-free interval for the median of about 1 - 2·0.5^n).

    python bench/freshness.py [--quick] [--rounds N] [--seconds S] [--settings a,b]
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from argparse import Namespace
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

# Run as `python bench/freshness.py`: the repo root first on the path, for `bench` and `tests`.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._common import (
    ROOT,
    bench_parser,
    bench_venv,
    proc_cpu_s,
    proc_rss_mb,
    proc_threads,
    report,
)
from bench._reference import LOGS, REFERENCE_PACKAGES, UNREADABLE, Spec
from tests.support.clock_camera import ClockCamera

MODELS = ROOT / "configs" / "models"
WIDTH, HEIGHT = 640, 480
FIRST_RESULT_TIMEOUT_S = 60.0  # imports, model load and RTSP probing; ~5 s normally
STOP_TIMEOUT_S = 10.0
FPS_TARGET, P99_TARGET = 1.0, 0.8  # ours/ref: fps at least equal, p99 at most 80 %


@dataclass(frozen=True)
class Setting:
    model: str  # a key of SPECS
    streams: int
    fps: int


SETTINGS = {
    "faces-1x15": Setting("faces", 1, 15),
    "faces-1x30": Setting("faces", 1, 30),
    "faces-4x15": Setting("faces", 4, 15),
    "people-1x15": Setting("people", 1, 15),
}
# Everything but the URLs; CenterFace at the camera's size, the person detector at 300x300.
SPECS: dict[str, dict[str, Any]] = {
    "faces": {
        "model": str(MODELS / "centerface.onnx"),
        "decoder": "centerface",
        "input_size": [WIDTH, HEIGHT],
        "labels": ["face"],
        "confidence": 0.5,
    },
    "people": {
        "model": str(MODELS / "person_ssdlite.onnx"),
        "decoder": "tf_od",
        "input_size": [300, 300],
        "labels": ["person"],
        "confidence": 0.5,
    },
}


class Record(NamedTuple):
    """One result line of a child (see bench/_reference.py's Recorder); wall times, s."""

    source: int
    stamp: int
    at: float  # the result reached the sink
    start: float  # the model step began on its frame
    done: float  # ... and ended
    decoded: float | None  # the frame left the decoder (ours only)

    @classmethod
    def parse(cls, line: str) -> Record | None:
        parts = line.split()
        if len(parts) not in (6, 7) or parts[0] != "R":
            return None  # a stray line (a library printing on stdout)
        at, start, done, *decoded = (float(p) for p in parts[3:])
        return cls(int(parts[1]), int(parts[2]), at, start, done, decoded[0] if decoded else None)


@dataclass
class Round:
    """One pipeline's measured window."""

    fps: float  # processed frames per second per stream
    min_stream_fps: float
    p50_ms: float  # emission → result
    p99_ms: float
    cpu_ms_per_frame: float
    rss_mb: float
    load: float  # the machine's 1-minute load average at the window's end
    unreadable: int  # results whose frame carried no readable stamp (should be 0)
    # (p50, p99) ms of: emission → model step start (`wait`), the model step (`model`:
    # pre, ORT, post), model step end → sink (`sink`), and for ours emission → decoded.
    stages: dict[str, tuple[float, float]]
    frames: int = 0  # results in the window, all streams


@dataclass
class Child:
    """A pipeline child process; a thread collects its result lines."""

    process: subprocess.Popen[str]
    records: list[Record] = field(default_factory=list)
    other: list[str] = field(default_factory=list)  # lines that are no Record
    first: dict[int, threading.Event] = field(default_factory=dict)

    reader: threading.Thread | None = None

    def start_reading(self, streams: int) -> None:
        self.first = {i: threading.Event() for i in range(streams)}
        self.reader = threading.Thread(target=self._read, name="child-reader", daemon=True)
        self.reader.start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            record = Record.parse(line)
            if record is None:
                self.other.append(line.strip())
            else:
                self.records.append(record)
                if record.source in self.first:
                    self.first[record.source].set()

    def wait_first_results(self, timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        for event in self.first.values():
            while not event.wait(0.2):
                if self.process.poll() is not None or time.monotonic() > deadline:
                    return False
        return True

    def stop(self) -> None:
        """Close stdin (the child's signal to stop), then kill if it lingers."""
        assert self.process.stdin is not None
        self.process.stdin.close()
        try:
            self.process.wait(STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(STOP_TIMEOUT_S)
        if self.reader is not None:
            self.reader.join(STOP_TIMEOUT_S)  # its last lines (summaries) are read


def measure(
    command: list[str], cameras: list[ClockCamera], warmup_s: float, seconds: float, log: Path
) -> Round | str:
    """Run one child over a window; its Round, or why it failed."""
    got = run_child(command, len(cameras), warmup_s, seconds, log)
    return got if isinstance(got, str) else summarize(got.window, cameras, got.usage)


@dataclass
class Window:
    """What one child did in the measured window."""

    window: list[Record]
    usage: dict[str, float]  # seconds, cpu_s, rss_mb, threads
    other: list[str]  # the child's lines that are no Record (its summary lines)


def run_child(
    command: list[str], streams: int, warmup_s: float, seconds: float, log: Path
) -> Window | str:
    """Start a child, wait for every stream's first result and `warmup_s`, measure for
    `seconds`, stop it; its results in the window and its usage, or why it failed."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1"}
    with log.open("w") as err:
        process = subprocess.Popen(
            command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err, text=True, env=env
        )
    child = Child(process)
    child.start_reading(streams)
    try:
        if not child.wait_first_results(FIRST_RESULT_TIMEOUT_S):
            return f"no result from every stream; see {log.relative_to(ROOT)}"
        time.sleep(warmup_s)  # the window starts after the first results have settled
        t0, cpu0 = time.time(), proc_cpu_s(process.pid)
        time.sleep(seconds)  # the measured window: live cameras, wall time by design
        t1, cpu1, rss = time.time(), proc_cpu_s(process.pid), proc_rss_mb(process.pid)
        threads = proc_threads(process.pid)
    finally:
        child.stop()
    window = [r for r in child.records if t0 <= r.at <= t1]
    usage = {"seconds": t1 - t0, "cpu_s": cpu1 - cpu0, "rss_mb": rss, "threads": threads}
    return Window(window, usage, child.other)


def summarize(
    window: list[Record], cameras: list[ClockCamera], usage: dict[str, float]
) -> Round | str:
    """Latency of each result from its frame's emission; rates over the window."""
    stages: dict[str, list[float]] = {"wait": [], "model": [], "sink": [], "decode": []}
    latencies, unreadable = [], 0
    for r in window:
        camera = cameras[r.source]
        index = None if r.stamp == UNREADABLE else camera.emissions.resolve(r.stamp)
        emitted = None if index is None else camera.emitted(index)
        if emitted is None:
            unreadable += 1
            continue
        latencies.append((r.at - emitted) * 1000)
        stages["wait"].append((r.start - emitted) * 1000)
        stages["model"].append((r.done - r.start) * 1000)
        stages["sink"].append((r.at - r.done) * 1000)
        if r.decoded is not None:
            stages["decode"].append((r.decoded - emitted) * 1000)
    if not latencies:
        return "no result in the window"
    per_stream = [sum(r.source == i for r in window) for i in range(len(cameras))]
    p50, p99 = _p50_p99(latencies)
    return Round(
        fps=len(window) / usage["seconds"] / len(cameras),
        frames=len(window),
        min_stream_fps=min(per_stream) / usage["seconds"],
        p50_ms=p50,
        p99_ms=p99,
        cpu_ms_per_frame=usage["cpu_s"] * 1000 / len(window),
        rss_mb=usage["rss_mb"],
        load=os.getloadavg()[0],
        unreadable=unreadable,
        stages={k: _p50_p99(v) for k, v in stages.items() if v},
    )


def _p50_p99(values: list[float]) -> tuple[float, float]:
    p50, p99 = np.percentile(values, [50, 99])
    return float(p50), float(p99)


def commands(spec: Spec, reference: Path | None) -> dict[str, list[str] | None]:
    """The child command of each pipeline (None: the reference could not be installed)."""
    children = str(ROOT / "bench" / "_reference.py")
    ours = [sys.executable, children, "ours", spec.to_json()]
    ref = None if reference is None else [str(reference), children, "ref", spec.to_json()]
    return {"ours": ours, "ref": ref}


def run_setting(
    name: str, setting: Setting, reference: Path | None, args: Namespace, workdir: Path
) -> dict[str, list[Round | str]]:
    """Every round of one setting, on cameras that stay up for all of them."""
    results: dict[str, list[Round | str]] = {"ours": [], "ref": []}
    cameras = [
        ClockCamera(WIDTH, HEIGHT, setting.fps, workdir=workdir, path=f"/cam{i}")
        for i in range(setting.streams)
    ]
    try:
        for camera in cameras:
            camera.start()
        spec = Spec(
            urls=[c.url for c in cameras],
            max_batch=setting.streams,
            **SPECS[setting.model],
        )
        runs = commands(spec, reference)
        for r in range(args.rounds):
            for pipeline in ("ours", "ref") if r % 2 == 0 else ("ref", "ours"):
                command = runs[pipeline]
                if command is None:
                    results[pipeline].append("reference not installed")
                    continue
                log = LOGS / f"{name}-{pipeline}-{r}.log"
                got = measure(command, cameras, args.warmup, args.seconds, log)
                results[pipeline].append(got)
                print(f"{name} round {r + 1} {pipeline:>4}: {describe(got)}", flush=True)
    finally:
        for camera in cameras:
            camera.stop()
    return results


def describe(got: Round | str) -> str:
    if isinstance(got, str):
        return f"failed: {got}"
    return (
        f"{got.fps:5.1f} fps (slowest stream {got.min_stream_fps:.1f}), "
        f"p50 {got.p50_ms:5.1f} ms, p99 {got.p99_ms:5.1f} ms, "
        f"CPU {got.cpu_ms_per_frame:5.1f} ms/frame, RSS {got.rss_mb:.0f} MB, load {got.load:.1f}"
        + (f", {got.unreadable} unreadable" if got.unreadable else "")
        + "\n    p50/p99 ms: "
        + ", ".join(f"{k} {p50:.0f}/{p99:.0f}" for k, (p50, p99) in got.stages.items())
    )


def interval(values: list[float]) -> str:
    """The range over rounds, "lo–hi", 3 significant digits (whole numbers from 1000)."""
    if not values:
        return "missing"
    return "–".join(f"{v:.3g}" if abs(v) < 1000 else f"{v:.0f}" for v in (min(values), max(values)))


SHOWN = ("fps", "min_stream_fps", "p50_ms", "p99_ms", "cpu_ms_per_frame", "rss_mb", "load")
STAGES = ("decode", "wait", "model", "sink")
WITH_RANGE = ("fps", "p50_ms", "p99_ms", "cpu_ms_per_frame")


def aggregate(
    name: str, results: dict[str, list[Round | str]], metrics: dict[str, Any]
) -> tuple[dict[str, str], dict[str, bool]]:
    """Medians of rounds (min–max for the main ones) per pipeline, and the ratios
    ours/ref of rounds run back to back (same round number)."""
    good = {p: [r for r in rs if isinstance(r, Round)] for p, rs in results.items()}
    for pipeline, rounds in good.items():
        metrics[f"{name}.{pipeline}.rounds"] = len(rounds)
        for key in SHOWN:
            values = [float(getattr(r, key)) for r in rounds]
            metrics[f"{name}.{pipeline}.{key}"] = _median(values)
            if key in WITH_RANGE:
                metrics[f"{name}.{pipeline}.{key}.range"] = interval(values)
        for stage in STAGES:
            for i, q in enumerate(("p50", "p99")):
                values = [r.stages[stage][i] for r in rounds if stage in r.stages]
                if values:
                    metrics[f"{name}.{pipeline}.{stage}_{q}_ms"] = _median(values)
    pairs = [
        (a, b)
        for a, b in zip(results["ours"], results["ref"], strict=True)
        if isinstance(a, Round) and isinstance(b, Round)
    ]
    ratios = {
        "fps_ratio": [a.fps / b.fps for a, b in pairs],
        "p99_ratio": [a.p99_ms / b.p99_ms for a, b in pairs],
    }
    for key, values in ratios.items():
        metrics[f"{name}.{key}"] = _median(values, 3)
        metrics[f"{name}.{key}.range"] = interval(values)
    targets = {
        f"{name}.fps_ratio": f">= {FPS_TARGET} (interval, less 2 frames of window edges)",
        f"{name}.p99_ratio": f"<= {P99_TARGET} (interval)",
    }
    # A count over a window is exact to a frame at either edge: when both pipelines
    # process every frame the camera sends, a round's ratio can read 0.99 by where the
    # window fell. The fps target allows those two frames, and no more.
    resolution = [2 / a.frames for a, _ in pairs]
    metrics[f"{name}.fps_ratio.resolution"] = round(max(resolution, default=0.0), 4)
    met = {
        f"{name}.fps_ratio": bool(pairs)
        and all(r >= FPS_TARGET - e for r, e in zip(ratios["fps_ratio"], resolution, strict=True)),
        f"{name}.p99_ratio": bool(pairs) and max(ratios["p99_ratio"]) <= P99_TARGET,
    }
    return targets, met


def _median(values: list[float], digits: int = 1) -> float | str:
    return round(statistics.median(values), digits) if values else "missing"


def print_summary(metrics: dict[str, Any], names: list[str]) -> None:
    """One line per setting and pipeline: medians of rounds, min–max in brackets."""
    print(f"\n{'setting':<12}{'':>5}  {'fps':>18}  {'p50 ms':>18}  {'p99 ms':>18}  CPU ms/frame")
    for name in names:
        for pipeline in ("ours", "ref"):
            cells = [
                f"{metrics[f'{name}.{pipeline}.{k}']} [{metrics[f'{name}.{pipeline}.{k}.range']}]"
                for k in WITH_RANGE
            ]
            print(f"{name:<12}{pipeline:>5}  " + "  ".join(f"{c:>18}" for c in cells))
        print(
            f"{'':<12}{'ratio':>5}  fps {metrics[f'{name}.fps_ratio']} "
            f"[{metrics[f'{name}.fps_ratio.range']}], "
            f"p99 {metrics[f'{name}.p99_ratio']} [{metrics[f'{name}.p99_ratio.range']}]"
        )


def main() -> None:
    parser = bench_parser((__doc__ or "").splitlines()[0])
    parser.add_argument("--rounds", type=int, help="rounds per setting (default 5; quick 1)")
    parser.add_argument("--seconds", type=float, help="measured window, s (default 10; quick 8)")
    parser.add_argument("--warmup", type=float, default=2.0, help="s after the first results")
    parser.add_argument("--settings", help=f"comma-separated, of {', '.join(SETTINGS)}")
    args = parser.parse_args()
    args.rounds = args.rounds or (1 if args.quick else 5)
    args.seconds = args.seconds or (8.0 if args.quick else 10.0)
    names = (args.settings or ("faces-1x15" if args.quick else ",".join(SETTINGS))).split(",")
    reference, status = bench_venv("reference-venv", list(REFERENCE_PACKAGES))
    print(f"reference ({' '.join(REFERENCE_PACKAGES)}): {status}", flush=True)
    LOGS.mkdir(parents=True, exist_ok=True)
    metrics: dict[str, Any] = {"reference": "ok" if reference else f"missing: {status}"}
    targets: dict[str, str] = {}
    met: dict[str, bool] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name in names:
            results = run_setting(name, SETTINGS[name], reference, args, Path(tmp))
            more_targets, more_met = aggregate(name, results, metrics)
            targets |= more_targets
            met |= more_met if reference else {}
    print_summary(metrics, names)
    report("freshness", metrics, targets, met)


if __name__ == "__main__":
    main()
