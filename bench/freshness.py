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
Rounds alternate the two pipelines in one run, the order rotating each round (ours
first, then ref first: bench/_compare.py), so that the machine's slow and fast spells
hit both alike; each is a fresh child process, alternated across processes. A round
measures a window that starts `warmup` seconds after every stream produced its first
result. Per round: processed fps per stream, the slowest stream's fps, latency p50/p99,
CPU ms per processed frame (utime + stime of the child), RSS, the machine's load, the
p50 of each stage: emission → model step start (`wait`), the model step (`model`), →
sink (`sink`), and for ours emission → the frame's arrival (`decode`: a camera frame is
dated by the arrival of its last packet, before it is decoded); and the share of the frames
the cameras emitted in the window (less its last LATE_S) whose result reached the sink
before the child stopped (`delivered`: counted by emission, so a window's edges cannot
gain or lose a frame). Beside emission → result, post-decode → result (`post_decode`):
from the moment the decoded frame was ready for the pipeline to its result, what the
pipeline itself adds once the camera's and the decoder's parts are done (the children
say how each is dated: bench/_reference.py); and for the reference, from its own
`frame_timestamp` (`frame_ts`, taken before it reads and decodes the frame). Per round
the ratios ours/ref: `fps_ratio` of the delivered shares (the processed fps over the same
emitted frames), `p99_ratio`, and `post_decode_p50_ratio` / `post_decode_p99_ratio`; the
figure is the median of the rounds' ratios with a bootstrap 95 % interval, a target met
only by the interval's bound (`judge`); the min–max over rounds is beside it (`.range`).

    python bench/freshness.py [--quick] [--rounds N] [--seconds S] [--settings a,b]
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import tempfile
import time
from argparse import Namespace
from dataclasses import dataclass
from pathlib import Path
from typing import Any

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
from bench._compare import Verdict, judge, method, ratios, rotations
from bench._reference import LOGS, REFERENCE_PACKAGES, UNREADABLE, Child, Record, Spec
from tests.support.clock_camera import ClockCamera

MODELS = ROOT / "configs" / "models"
WIDTH, HEIGHT = 640, 480
FIRST_RESULT_TIMEOUT_S = 60.0  # imports, model load and RTSP probing; ~5 s normally
FPS_TARGET, P99_TARGET = 1.0, 0.8  # ours/ref: fps at least equal, p99 at most 80 %
POST_DECODE_TARGET = 1.0  # ours/ref of post-decode → result p50 and p99: no worse
# A frame emitted in the window's last LATE_S is not counted in `delivered`: its result
# may still be on its way when the child stops (p99 latency is under 0.5 s everywhere).
LATE_S = 1.0
ARMS = ("ours", "ref")


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
    # Of the frames the cameras emitted from the window's start to LATE_S before its
    # end, the share whose result reached the sink before the child stopped.
    delivered: float
    # (p50, p99) ms of: emission → model step start (`wait`), the model step (`model`:
    # pre, ORT, post), model step end → sink (`sink`), for ours emission → the frame's
    # arrival (`decode`: its capture time, the last packet, before decoding), for both
    # the decoded frame ready → sink (`post_decode`), and for the reference its
    # `frame_timestamp` → sink (`frame_ts`).
    stages: dict[str, tuple[float, float]]


def measure(
    command: list[str], cameras: list[ClockCamera], warmup_s: float, seconds: float, log: Path
) -> Round | str:
    """Run one child over a window; its Round, or why it failed."""
    got = run_child(command, len(cameras), warmup_s, seconds, log)
    return got if isinstance(got, str) else summarize(got, cameras)


@dataclass
class Window:
    """What one child did in the measured window."""

    window: list[Record]  # the results that reached the sink in the window
    records: list[Record]  # every result, to the child's stop
    usage: dict[str, float]  # t0, t1 (wall), seconds, cpu_s, rss_mb, threads
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
    usage = {"t0": t0, "t1": t1, "seconds": t1 - t0, "cpu_s": cpu1 - cpu0, "rss_mb": rss}
    usage["threads"] = threads
    return Window(window, child.records, usage, child.other)


def summarize(got: Window, cameras: list[ClockCamera]) -> Round | str:
    """Latency of each result from its frame's emission; rates over the window."""
    window, usage = got.window, got.usage
    stages: dict[str, list[float]] = {name: [] for name in STAGES}
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
        if r.ready is not None:
            stages["post_decode"].append((r.at - r.ready) * 1000)
        if r.frame_ts is not None:
            stages["frame_ts"].append((r.at - r.frame_ts) * 1000)
    if not latencies:
        return "no result in the window"
    per_stream = [sum(r.source == i for r in window) for i in range(len(cameras))]
    p50, p99 = _p50_p99(latencies)
    return Round(
        fps=len(window) / usage["seconds"] / len(cameras),
        min_stream_fps=min(per_stream) / usage["seconds"],
        p50_ms=p50,
        p99_ms=p99,
        cpu_ms_per_frame=usage["cpu_s"] * 1000 / len(window),
        rss_mb=usage["rss_mb"],
        load=os.getloadavg()[0],
        unreadable=unreadable,
        delivered=delivered(got.records, cameras, usage["t0"], usage["t1"] - LATE_S),
        stages={k: _p50_p99(v) for k, v in stages.items() if v},
    )


def delivered(records: list[Record], cameras: list[ClockCamera], start: float, end: float) -> float:
    """Of the frames the cameras emitted after wall time `start` up to `end`, the share
    with a result among `records`: exact, where a count of results over a window can gain
    or lose a frame at either edge."""
    emitted = got = 0
    for i, camera in enumerate(cameras):
        first, last = camera.emissions.newest_at(start), camera.emissions.newest_at(end)
        if first is None or last is None:
            continue
        frames = range(first + 1, last + 1)
        emitted += len(frames)
        stamps = {r.stamp for r in records if r.source == i and r.stamp != UNREADABLE}
        got += len({camera.emissions.resolve(s) for s in stamps} & set(frames))
    return got / emitted if emitted else float("nan")


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
        for r, order in enumerate(rotations(ARMS, args.rounds)):
            for pipeline in order:
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
        f"delivered {got.delivered:.3f}, "
        f"p50 {got.p50_ms:5.1f} ms, p99 {got.p99_ms:5.1f} ms, "
        f"CPU {got.cpu_ms_per_frame:5.1f} ms/frame, RSS {got.rss_mb:.0f} MB, load {got.load:.1f}"
        + (f", {got.unreadable} unreadable" if got.unreadable else "")
        + "\n    p50/p99 ms: "
        + ", ".join(f"{k} {p50:.0f}/{p99:.0f}" for k, (p50, p99) in got.stages.items())
    )


def spread(values: list[float]) -> str:
    """The range over rounds, "lo–hi", 3 significant digits (whole numbers from 1000)."""
    if not values:
        return "missing"
    return "–".join(f"{v:.3g}" if abs(v) < 1000 else f"{v:.0f}" for v in (min(values), max(values)))


SHOWN = (
    "fps",
    "min_stream_fps",
    "delivered",
    "p50_ms",
    "p99_ms",
    "cpu_ms_per_frame",
    "rss_mb",
    "load",
)
STAGES = ("decode", "wait", "model", "sink", "post_decode", "frame_ts")
QS = ("p50", "p99")
RATIOS = ("fps_ratio", "p99_ratio", "post_decode_p50_ratio", "post_decode_p99_ratio")
WITH_RANGE = ("fps", "p50_ms", "p99_ms", "cpu_ms_per_frame")


def aggregate(
    name: str, results: dict[str, list[Round | str]], metrics: dict[str, Any]
) -> tuple[dict[str, str], dict[str, Verdict]]:
    """Medians of rounds (min–max for the main ones) per pipeline; the ratios ours/ref
    of each round's pair judged by their median's interval (bench/_compare.py)."""
    good = {p: [r for r in rs if isinstance(r, Round)] for p, rs in results.items()}
    for pipeline, rounds in good.items():
        metrics[f"{name}.{pipeline}.rounds"] = len(rounds)
        for key in SHOWN:
            values = [float(getattr(r, key)) for r in rounds]
            metrics[f"{name}.{pipeline}.{key}"] = _median(values, 3 if key == "delivered" else 1)
            if key in WITH_RANGE:
                metrics[f"{name}.{pipeline}.{key}.range"] = spread(values)
        for stage in STAGES:
            for i, q in enumerate(QS):
                values = [r.stages[stage][i] for r in rounds if stage in r.stages]
                if values:
                    metrics[f"{name}.{pipeline}.{stage}_{q}_ms"] = _median(values)
    pairs = [
        (a, b)
        for a, b in zip(results["ours"], results["ref"], strict=True)
        if isinstance(a, Round) and isinstance(b, Round)
    ]
    ours, ref = [a for a, _ in pairs], [b for _, b in pairs]
    per_round = {
        "fps_ratio": ratios([a.delivered for a in ours], [b.delivered for b in ref]),
        "p99_ratio": ratios([a.p99_ms for a in ours], [b.p99_ms for b in ref]),
        "post_decode_p50_ratio": stage_ratios(pairs, "post_decode", 0),
        "post_decode_p99_ratio": stage_ratios(pairs, "post_decode", 1),
    }
    for key, values in per_round.items():
        metrics[f"{name}.{key}"] = _median(values, 3)
        metrics[f"{name}.{key}.range"] = spread(values)
    verdicts = {
        f"{name}.fps_ratio": judge(per_round["fps_ratio"], at_least=FPS_TARGET),
        f"{name}.p99_ratio": judge(per_round["p99_ratio"], at_most=P99_TARGET),
    }
    for key in ("post_decode_p50_ratio", "post_decode_p99_ratio"):
        verdicts[f"{name}.{key}"] = judge(per_round[key], at_most=POST_DECODE_TARGET)
    side = {True: "lower", False: "upper"}
    targets = {
        key: f"{v.target} (the 95 % interval's {side[v.at_least is not None]} bound)"
        for key, v in verdicts.items()
    }
    for q in QS:  # what the ratio's bound means, said where the results are read
        targets[f"{name}.post_decode_{q}_ratio"] += (
            f": post-decode → result {q} no worse than the reference's"
        )
    return targets, verdicts


def stage_ratios(pairs: list[tuple[Round, Round]], stage: str, i: int) -> list[float]:
    """Per round with the stage in both: ours ÷ ref of its p50 (`i` 0) or p99 (1)."""
    both = [(a.stages, b.stages) for a, b in pairs if stage in a.stages and stage in b.stages]
    return ratios([a[stage][i] for a, _ in both], [b[stage][i] for _, b in both])


def _median(values: list[float], digits: int = 1) -> float | str:
    return round(statistics.median(values), digits) if values else "missing"


def print_summary(metrics: dict[str, Any], names: list[str], verdicts: dict[str, Verdict]) -> None:
    """One line per setting and pipeline: medians of rounds, min–max in brackets; the
    ratios' medians with their 95 % intervals."""
    print(
        f"\n{'setting':<12}{'':>5}  {'fps':>18}  {'p50 ms':>18}  {'p99 ms':>18}  "
        f"{'CPU ms/frame':>18}  post-decode p50/p99 ms"
    )
    for name in names:
        for pipeline in ARMS:
            cells = [
                f"{metrics[f'{name}.{pipeline}.{k}']} [{metrics[f'{name}.{pipeline}.{k}.range']}]"
                for k in WITH_RANGE
            ]
            post = [metrics.get(f"{name}.{pipeline}.post_decode_{q}_ms", "missing") for q in QS]
            cells.append("/".join(str(v) for v in post))
            print(f"{name:<12}{pipeline:>5}  " + "  ".join(f"{c:>18}" for c in cells))
        shown = [
            f"{key} {v.median:.3f} [{v.low:.3f}–{v.high:.3f}] {'met' if v.met else 'NOT met'}"
            for key in RATIOS
            if (v := verdicts.get(f"{name}.{key}")) is not None
        ]
        print(f"{'':<12}{'ratio':>5}  " + (", ".join(shown) or "no reference"))


def main() -> None:
    parser = bench_parser((__doc__ or "").splitlines()[0])
    parser.add_argument("--rounds", type=int, help="rounds per setting (default 5; quick 1)")
    parser.add_argument("--seconds", type=float, help="measured window, s (default 10; quick 8)")
    parser.add_argument("--warmup", type=float, default=2.0, help="s after the first results")
    parser.add_argument("--settings", help=f"comma-separated, of {', '.join(SETTINGS)}")
    parser.add_argument(
        "--name",
        default="freshness",
        help="the results file, bench/results/NAME.json: a run of some settings under a "
        "name of its own leaves the full run's file as it was",
    )
    args = parser.parse_args()
    args.rounds = args.rounds or (1 if args.quick else 5)
    args.seconds = args.seconds or (8.0 if args.quick else 10.0)
    names = (args.settings or ("faces-1x15" if args.quick else ",".join(SETTINGS))).split(",")
    reference, status = bench_venv("reference-venv", list(REFERENCE_PACKAGES))
    print(f"reference ({' '.join(REFERENCE_PACKAGES)}): {status}", flush=True)
    LOGS.mkdir(parents=True, exist_ok=True)
    metrics: dict[str, Any] = {"reference": "ok" if reference else f"missing: {status}"}
    targets: dict[str, str] = {}
    verdicts: dict[str, Verdict] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name in names:
            results = run_setting(name, SETTINGS[name], reference, args, Path(tmp))
            more_targets, more_verdicts = aggregate(name, results, metrics)
            targets |= more_targets
            verdicts |= more_verdicts if reference else {}  # nothing compared without it
    print_summary(metrics, names, verdicts)
    report(
        args.name,
        metrics,
        targets,
        {key: v.met for key, v in verdicts.items()},
        method=how(args, names),
        verdicts={key: v.as_json() for key, v in verdicts.items()},
    )


def how(args: Namespace, names: list[str]) -> dict[str, Any]:
    """The results file's `method`."""
    return method(
        "emission → result latency and delivered frames of ours against Roboflow's "
        "InferencePipeline, on clock cameras",
        ARMS,
        args.rounds,
        f"per setting, one window of {args.seconds:g} s per pipeline ({args.warmup:g} s "
        "after every stream's first result), each pipeline a fresh child process: ours "
        "in the appliance's venv, ref in bench/.work/reference-venv; alternation is "
        "across processes, on cameras that stay up for every round",
        settings=names,
        fps_ratio=(
            "ours ÷ ref of the share of the frames the cameras emitted in the window (less "
            f"its last {LATE_S:g} s) whose result reached the sink before the child stopped: "
            "the processed fps over the same emitted frames, exact where a count of "
            "results over a window gains or loses a frame at its edges"
        ),
        p99_ratio="ours ÷ ref of the p99 of emission → result over the window",
        post_decode_ratios=(
            "ours ÷ ref of the p50 and the p99 of post-decode → result over the window: "
            "from the decoded frame ready for the pipeline (ours: the grabber's decode end, "
            "just before the frame goes to the worker's slot; ref: its VideoFrame built, "
            "right after retrieve()) to the result in the sink; the reference's own "
            "frame_timestamp is taken before grab() reads and decodes the frame, so "
            "frame_timestamp → result (stage frame_ts) is reported beside it, not judged"
        ),
    )


if __name__ == "__main__":
    main()
