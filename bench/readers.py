"""RTSP readers: our RTP reader against FFmpeg's, emission → frame arrival and CPU per frame.

The camera is the clock camera of bench/freshness.py (tests/support/clock_camera.py):
640x480 H.264 over RTSP, every frame stamped with its index, every index's emission
time logged as its first RTP packet leaves. Per setting (15 and 30 fps) one camera stays
up for every round; the arms are one appliance `Runtime` each, one stream, started and
stopped in this process in turn, the order rotating each round (bench/_compare.py):

- `auto`: `source.reader: auto`, our RTP reader (appliance/sources/rtp.py);
- `ffmpeg`: `reader: ffmpeg`, FFmpeg's RTSP reader (appliance/sources/pyav.py);
- `nobuffer`: `reader: ffmpeg` with `options: {fflags: nobuffer}`.

The workflow is the frame itself (no block): the reader is the point, and a model would
make the CPU figures measure its contention. A round measures a window that starts
`warmup` seconds after the first result. Per arm and round, the frame's index read back
from its own pixels: emission → the frame's arrival p50/p99 (bench/freshness.py's
`decode` stage: a camera frame's capture time, when its reader has its last packet, for
FFmpeg's reader when its demuxer hands the frame over, before decoding), emission →
result p50 (decoded to BGR, handed over and through the empty workflow), the CPU per
frame of the thread that reads and decodes (`grab:s0`, /proc schedstat, as
bench/_crossover.py reads it) and of it with the threads Python did not start
(`native`: FFmpeg's), over the frames that reached the workflow in the window. Per
round against the same round's `auto`: the ratio of decode p50s (target: at most 0.5 by
the interval's upper bound) and the difference of reader CPU per frame (reported with
its interval, no target); `nobuffer` ÷ `ffmpeg` of the decode p50s, no target. Figures:
the median of rounds with a bootstrap 95 % interval (`judge`).

    python bench/readers.py [--quick] [--rounds N] [--seconds S] [--warmup S] [--fps 15,30]
"""

from __future__ import annotations

import os
import statistics
import sys
import tempfile
import threading
import time
from argparse import Namespace
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# Run as `python bench/readers.py`: the repo root first on the path, for `bench` and `tests`.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from appliance.config import AppConfig, parse_config
from appliance.runtime.runtime import Runtime
from bench._common import ROOT, bench_parser, report
from bench._compare import Verdict, judge, method, ratios, rotations
from bench._crossover import thread_cpu_ns
from bench._reference import UNREADABLE, Record
from bench.freshness import HEIGHT, WIDTH, Round, Window, spread, summarize
from pipelines.types import FrameResult
from tests.support.clock_camera import ClockCamera, read_stamp

ARMS: dict[str, dict[str, Any]] = {  # each arm's source settings besides the URL
    "auto": {"reader": "auto"},
    "ffmpeg": {"reader": "ffmpeg"},
    "nobuffer": {"reader": "ffmpeg", "options": {"fflags": "nobuffer"}},
}
BASELINE = "auto"
DECODE_RATIO_TARGET = 0.5  # auto ÷ an FFmpeg arm, decode p50: a frame interval is big
# The workflow is the frame itself: no model, so the CPU is the reader's.
FRAMES_WORKFLOW: dict[str, Any] = {"name": "frames", "blocks": [], "outputs": {"video": "frame"}}
READER_THREADS = ("grab", "native")  # reading and decoding: ours and FFmpeg's threads
FIRST_RESULT_TIMEOUT_S = 30.0  # RTSP session and FFmpeg's probing; ~1 s normally
WORK = ROOT / "bench" / ".work" / "readers"  # the runs' rolling traces


@dataclass
class Sample:
    """One arm's measured window."""

    round: Round  # bench/freshness.py's figures; its `decode` stage is the one here
    grab_cpu_ms: float  # CPU per frame of the `grab:s0` thread
    reader_cpu_ms: float  # ... and of the threads Python did not start (FFmpeg's)
    load: float  # the machine's 1-minute load average at the window's end


def config(url: str, source: dict[str, Any]) -> AppConfig:
    """One stream of `url` with the arm's `source` settings and the frame workflow."""
    stream = {"id": "s0", "source": {"url": url, **source}, "workflow": FRAMES_WORKFLOW}
    # Profiling stays on (the product's default); its rolling traces go under WORK.
    profiling = {"dir": str(WORK / "traces")}
    return parse_config({"models": {}, "streams": [stream], "profiling": profiling}, ROOT)


def measure(
    camera: ClockCamera, source: dict[str, Any], warmup_s: float, seconds: float
) -> Sample | str:
    """One runtime over a window of `seconds`, `warmup_s` after its first result; its
    Sample, or why it failed."""
    records: list[Record] = []
    first = threading.Event()

    def on_result(result: FrameResult) -> None:  # the stream's worker thread
        now = time.time()  # before the stamp is read, as bench/_reference.py's Recorder
        stamp = read_stamp(result.captured())
        decoded = result.capture_time  # wall clock; the spans below are on perf_counter
        start = decoded + result.start_mono - result.capture_mono
        done = decoded + result.done_mono - result.capture_mono
        records.append(Record(0, UNREADABLE if stamp is None else stamp, now, start, done, decoded))
        first.set()

    runtime = Runtime(config(camera.url, source))
    runtime.subscribe(on_result)
    runtime.start()
    try:
        if not first.wait(FIRST_RESULT_TIMEOUT_S):
            return f"no result in {FIRST_RESULT_TIMEOUT_S:g} s"
        time.sleep(warmup_s)  # the window starts after the first results have settled
        t0, cpu0 = time.time(), thread_cpu_ns()
        time.sleep(seconds)  # the measured window: a live camera, wall time by design
        t1, cpu1 = time.time(), thread_cpu_ns()
    finally:
        runtime.stop()
    window = [r for r in records if t0 <= r.at <= t1]
    usage = {"t0": t0, "t1": t1, "seconds": t1 - t0, "cpu_s": 0.0, "rss_mb": 0.0}
    got = summarize(Window(window, records, usage, []), [camera])
    if isinstance(got, str):
        return got
    if "decode" not in got.stages:
        return "no decode time in the window"
    cpu = {k: (cpu1.get(k, 0) - cpu0.get(k, 0)) / 1e6 / len(window) for k in READER_THREADS}
    return Sample(got, cpu["grab"], sum(cpu.values()), os.getloadavg()[0])


def run_setting(fps: int, args: Namespace, workdir: Path) -> dict[str, list[Sample | str]]:
    """Every round of one frame rate, on a camera that stays up for all of them."""
    results: dict[str, list[Sample | str]] = {arm: [] for arm in ARMS}
    with ClockCamera(WIDTH, HEIGHT, fps, workdir=workdir) as camera:
        for r, order in enumerate(rotations(list(ARMS), args.rounds)):
            for arm in order:
                got = measure(camera, ARMS[arm], args.warmup, args.seconds)
                results[arm].append(got)
                print(f"{fps} fps round {r + 1} {arm:>8}: {describe(got)}", flush=True)
    return results


def describe(got: Sample | str) -> str:
    if isinstance(got, str):
        return f"failed: {got}"
    decode, r = got.round.stages["decode"], got.round
    return (
        f"decode p50 {decode[0]:6.1f} p99 {decode[1]:6.1f} ms, result p50 {r.p50_ms:6.1f} ms, "
        f"{r.fps:4.1f} fps, delivered {r.delivered:.3f}, CPU ms/frame grab "
        f"{got.grab_cpu_ms:.2f} reader {got.reader_cpu_ms:.2f}, load {got.load:.1f}"
    )


FIGURES: dict[
    str, Callable[[Sample], float]
] = {  # per arm: each round's value, median of rounds in the results file
    "decode_p50_ms": lambda s: s.round.stages["decode"][0],
    "decode_p99_ms": lambda s: s.round.stages["decode"][1],
    "result_p50_ms": lambda s: s.round.p50_ms,
    "fps": lambda s: s.round.fps,
    "delivered": lambda s: s.round.delivered,
    "grab_cpu_ms": lambda s: s.grab_cpu_ms,
    "reader_cpu_ms": lambda s: s.reader_cpu_ms,
    "load": lambda s: s.load,
}
WITH_RANGE = ("decode_p50_ms", "reader_cpu_ms")


def aggregate(
    name: str, results: dict[str, list[Sample | str]], metrics: dict[str, Any]
) -> dict[str, Verdict]:
    """Medians of rounds per arm; per round against `auto` the decode p50 ratio and the
    reader CPU difference, and nobuffer ÷ ffmpeg, each judged by its median's interval."""
    for arm, samples in results.items():
        good = [s for s in samples if isinstance(s, Sample)]
        metrics[f"{name}.{arm}.rounds"] = len(good)
        for key, figure in FIGURES.items():
            values = [float(figure(s)) for s in good]
            metrics[f"{name}.{arm}.{key}"] = _median(values, 3 if key == "delivered" else 2)
            if key in WITH_RANGE:
                metrics[f"{name}.{arm}.{key}.range"] = spread(values)
    verdicts: dict[str, Verdict] = {}
    for arm in ARMS:
        if arm == BASELINE:
            continue
        base, other = paired(results[BASELINE], results[arm])
        decode = ratios([_decode_p50(s) for s in base], [_decode_p50(s) for s in other])
        cpu = [a.reader_cpu_ms - b.reader_cpu_ms for a, b in zip(base, other, strict=True)]
        verdicts[f"{name}.auto_vs_{arm}.decode_p50_ratio"] = judge(
            decode, at_most=DECODE_RATIO_TARGET
        )
        verdicts[f"{name}.auto_vs_{arm}.reader_cpu_diff_ms"] = judge(cpu)
    nobuffer, ffmpeg = paired(results["nobuffer"], results["ffmpeg"])
    verdicts[f"{name}.nobuffer_vs_ffmpeg.decode_p50_ratio"] = judge(
        ratios([_decode_p50(s) for s in nobuffer], [_decode_p50(s) for s in ffmpeg])
    )
    for key, verdict in verdicts.items():
        metrics[key] = round(verdict.median, 3 if "ratio" in key else 2)
    return verdicts


def paired(a: list[Sample | str], b: list[Sample | str]) -> tuple[list[Sample], list[Sample]]:
    """The rounds in which both arms have a Sample."""
    pairs = [
        (x, y) for x, y in zip(a, b, strict=True) if isinstance(x, Sample) and isinstance(y, Sample)
    ]
    return [x for x, _ in pairs], [y for _, y in pairs]


def _decode_p50(sample: Sample) -> float:
    return sample.round.stages["decode"][0]


def _median(values: list[float], digits: int) -> float | str:
    return round(statistics.median(values), digits) if values else "missing"


def print_summary(metrics: dict[str, Any], names: list[str], verdicts: dict[str, Verdict]) -> None:
    """Per setting and arm: decode p50 and reader CPU (medians, min–max); the comparisons'
    medians with their 95 % intervals."""
    print(f"\n{'setting':<8}{'arm':>9}  {'decode p50 ms':>22}  {'reader CPU ms/frame':>22}")
    for name in names:
        for arm in ARMS:
            cells = [
                f"{metrics[f'{name}.{arm}.{k}']} [{metrics[f'{name}.{arm}.{k}.range']}]"
                for k in WITH_RANGE
            ]
            print(f"{name:<8}{arm:>9}  " + "  ".join(f"{c:>22}" for c in cells))
        for key, v in verdicts.items():
            if key.startswith(f"{name}."):
                verdict = "" if not v.target else (" met" if v.met else " NOT met")
                shown = f"{v.median:.3f} [{v.low:.3f}–{v.high:.3f}]{verdict}"
                print(f"{'':<8}{key[len(name) + 1 :]}: {shown}")


def main() -> None:
    parser = bench_parser((__doc__ or "").splitlines()[0])
    parser.add_argument("--rounds", type=int, help="rounds per frame rate (default 6; quick 1)")
    parser.add_argument("--seconds", type=float, help="measured window, s (default 6; quick 3)")
    parser.add_argument(
        "--warmup", type=float, help="s after the first result (default 1.5; quick 1)"
    )
    parser.add_argument("--fps", default="15,30", help="the camera's frame rates, comma-separated")
    args = parser.parse_args()
    args.rounds = args.rounds or (1 if args.quick else 6)
    args.seconds = args.seconds or (3.0 if args.quick else 6.0)
    args.warmup = args.warmup if args.warmup is not None else (1.0 if args.quick else 1.5)
    rates = [int(f) for f in args.fps.split(",")]
    names = [f"{fps}fps" for fps in rates]
    WORK.mkdir(parents=True, exist_ok=True)
    metrics: dict[str, Any] = {"load_at_start": round(os.getloadavg()[0], 1)}
    verdicts: dict[str, Verdict] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for fps, name in zip(rates, names, strict=True):
            verdicts |= aggregate(name, run_setting(fps, args, Path(tmp)), metrics)
    print_summary(metrics, names, verdicts)
    targeted = {key: v for key, v in verdicts.items() if v.target}
    report(
        "readers",
        metrics,
        {key: f"{v.target} (the 95 % interval's upper bound)" for key, v in targeted.items()},
        {key: v.met for key, v in targeted.items()},
        method=how(args, names),
        verdicts={key: v.as_json() for key, v in verdicts.items()},
    )


def how(args: Namespace, names: list[str]) -> dict[str, Any]:
    """The results file's `method`."""
    return method(
        "emission → frame arrival and the reading thread's CPU per frame of our RTP reader "
        "(reader: auto) against FFmpeg's RTSP reader (reader: ffmpeg, and with fflags="
        f"nobuffer), on a {WIDTH}x{HEIGHT} H.264 clock camera, the workflow the frame itself",
        list(ARMS),
        args.rounds,
        f"per setting, one window of {args.seconds:g} s per arm ({args.warmup:g} s after its "
        "first result), each arm a fresh appliance Runtime with one stream in the bench's "
        "process, on a camera that stays up for every round",
        settings=names,
        sources=ARMS,
        decode_p50_ratio=(
            "auto ÷ the arm, of the window's p50 of emission → the frame's arrival (its "
            "capture time: its last packet for ours, FFmpeg's demuxer handing it over for "
            "FFmpeg's; before decoding)"
        ),
        reader_cpu_diff_ms=(
            "auto − the arm, of the CPU ms per frame of the grab:s0 thread plus the threads "
            "Python did not start (FFmpeg's), over the frames that reached the workflow in "
            "the window (/proc schedstat)"
        ),
    )


if __name__ == "__main__":
    main()
