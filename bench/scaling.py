"""Many streams, fairly: 1, 2, 4, 8, 16 cameras on one appliance, person detector, batching.

One clock camera (tests/support/clock_camera.py, 640x480 at 15 fps, realtime) serves
every stream (its RTSP media is shared, as a real camera's is; one encoder, so the camera
does not eat the cores the appliance needs). Each stream reads it over its own RTSP
session and decodes it itself. For each count, one appliance child (bench/_reference.py
`ours`, the same as bench/freshness.py's) runs over a measured window:

- total and per-stream processed fps, and the slowest stream's (fairness under overload:
  target slowest >= 0.8 x mean);
- emission -> result latency p50/p99 (the camera's clock, read from each frame's pixels):
  bounded under overload, because every stream takes the newest frame;
- mean batch size (samples / session runs), RSS and threads; memory per extra stream is
  the slope of RSS over the stream count, per round (target <= 30 MB).

The counts alternate in one run, a fresh child each, their order rotated by one each
round (bench/_compare.py's `rotations`), so that the machine's fast and slow spells do
not line up with the stream count. The two targets are judged per round (the round's
RSS slope; the slowest stream over the mean at the largest count), median with a
bootstrap 95 % interval, met only by the interval's bound (`judge`). Writes
bench/results/scaling.json and, where matplotlib can be installed into a bench-only
venv, bench/results/scaling.png.

    python bench/scaling.py [--quick] [--counts 1,2,4,8,16] [--rounds N] [--seconds S]
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

# Run as `python bench/scaling.py`: the repo root first on the path, for `bench` and `tests`.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import numpy as np

from bench._common import RESULTS, ROOT, bench_parser, bench_venv, report
from bench._compare import Verdict, judge, method, rotations
from bench._reference import LOGS, Spec
from bench.freshness import HEIGHT, SPECS, WIDTH, Round, run_child, summarize
from tests.support.clock_camera import ClockCamera

FPS = 15  # the camera's rate: 16 streams ask for 240 frames/s, past this machine's model
MAX_BATCH = 8
FAIRNESS_TARGET = 0.8  # slowest stream's fps / mean stream fps, under overload
MB_PER_STREAM_TARGET = 30.0


def run_count(camera: ClockCamera, count: int, args: Any, log: Path) -> dict[str, Any] | str:
    """One child over `count` streams of the camera: its figures, or why it failed."""
    spec = Spec(urls=[camera.url] * count, max_batch=min(count, MAX_BATCH), **SPECS["people"])
    command = [sys.executable, str(ROOT / "bench" / "_reference.py"), "ours", spec.to_json()]
    got = run_child(command, count, args.warmup, args.seconds, log)
    if isinstance(got, str):
        return got
    summary = summarize(got, [camera] * count)
    if isinstance(summary, str):
        return summary
    return _figures(summary, count, got.usage, got.other)


def _figures(r: Round, count: int, usage: dict[str, float], other: list[str]) -> dict[str, Any]:
    batches = [line.split() for line in other if line.startswith("B ")]
    mean_batch = int(batches[-1][2]) / max(1, int(batches[-1][1])) if batches else None
    return {
        "total_fps": r.fps * count,
        "stream_fps": r.fps,
        "fairness": r.min_stream_fps / r.fps if r.fps else 0.0,
        "p50_ms": r.p50_ms,
        "p99_ms": r.p99_ms,
        "mean_batch": mean_batch,
        "rss_mb": usage["rss_mb"],
        "threads": usage["threads"],
        "cpu_ms_per_frame": r.cpu_ms_per_frame,
    }


Rounds = list[dict[int, dict[str, Any]]]  # per round: stream count -> its figures


def aggregate(per_round: Rounds) -> tuple[dict[str, Any], dict[str, Any]]:
    """Per count: the median of rounds of each figure (min-max of fps and p99); the
    fairness of the worst round at the largest count."""
    every = sorted({c for r in per_round for c in r})
    points = {c: [r[c] for r in per_round if c in r] for c in every}
    metrics: dict[str, Any] = {}
    table: dict[str, Any] = {}
    for count, rounds in sorted(points.items()):
        row = {k: _median([p[k] for p in rounds if p[k] is not None])
               for k in rounds[0]} if rounds else {}  # fmt: skip
        table[str(count)] = row
        for key, value in row.items():
            metrics[f"{count}.{key}"] = value
        for key in ("stream_fps", "p99_ms", "fairness"):
            values = [p[key] for p in rounds]
            metrics[f"{count}.{key}.range"] = f"{min(values):.3g}-{max(values):.3g}"
    counts = [c for c in sorted(points) if points[c]]
    if counts:
        top = counts[-1]
        metrics["fairness_at_max"] = round(min(p["fairness"] for p in points[top]), 3)
        metrics["max_streams"] = top
    return metrics, table


def verdicts(rounds: Rounds, metrics: dict[str, Any]) -> dict[str, Verdict]:
    """Memory per extra stream: each round's slope of RSS over its counts; fairness: each
    round's slowest stream over the mean at the largest count. Median with interval."""
    slopes = []
    for r in rounds:
        counts = sorted(r)
        if len(counts) >= 2:
            rss = [r[c]["rss_mb"] for c in counts]
            slopes.append(float(np.polyfit(counts, rss, 1)[0]))
    memory = judge(slopes, at_most=MB_PER_STREAM_TARGET)
    metrics["mb_per_extra_stream"] = round(memory.median, 1)
    metrics["mb_per_extra_stream.ci95"] = f"{memory.low:.1f}-{memory.high:.1f}"
    top = metrics.get("max_streams")
    fairness = judge([r[top]["fairness"] for r in rounds if top in r], at_least=FAIRNESS_TARGET)
    return {"mb_per_extra_stream": memory, "fairness_at_max": fairness}


def how(counts: list[int], rounds: int, args: Any) -> dict[str, Any]:
    """The results file's `method`."""
    return method(
        f"one appliance child per stream count (bench/_reference.py `ours`), every stream "
        f"reading one clock camera ({WIDTH}x{HEIGHT} at {FPS} fps) over its own RTSP "
        "session, the person detector batching",
        [f"{c} streams" for c in counts],
        rounds,
        f"each count in turn, a fresh process: its first results, {args.warmup} s of "
        f"warm-up, then a measured window of {args.seconds} s",
        order="alternating in one run (separate processes, one after another), the "
        "order of the counts rotated by one each round",
        figure="memory: per round, the least-squares slope of RSS over that round's "
        "counts; fairness: per round, the slowest stream's fps over the mean at the "
        "largest count; each the median over rounds with its interval. The other "
        "figures: per count, the median of the rounds, with min-max",
    )


def _median(values: list[float]) -> float | None:
    return round(float(statistics.median(values)), 2) if values else None


def plot(table: dict[str, Any]) -> str:
    """bench/results/scaling.png, drawn by matplotlib in a bench-only venv."""
    python, status = bench_venv("plot-venv", ["matplotlib==3.10.*"])
    if python is None:
        return f"no plot: {status}"
    script = """
import json, sys
import matplotlib; matplotlib.use("Agg")
import matplotlib.pyplot as plt
table = json.loads(sys.argv[1]); counts = sorted(table, key=int)
x = [int(c) for c in counts]
fig, (a, b, c) = plt.subplots(1, 3, figsize=(13, 4))
a.plot(x, [table[k]["total_fps"] for k in counts], "o-", label="total")
a.plot(x, [table[k]["stream_fps"] for k in counts], "s-", label="per stream")
a.set_xlabel("streams"); a.set_ylabel("processed fps"); a.legend(); a.set_xscale("log", base=2)
b.plot(x, [table[k]["p50_ms"] for k in counts], "o-", label="p50")
b.plot(x, [table[k]["p99_ms"] for k in counts], "s-", label="p99")
b.set_xlabel("streams"); b.set_ylabel("emission -> result, ms"); b.legend()
b.set_xscale("log", base=2)
c.plot(x, [table[k]["rss_mb"] for k in counts], "o-")
c.set_xlabel("streams"); c.set_ylabel("RSS, MB"); c.set_xscale("log", base=2)
fig.suptitle("appliance scaling: person detector, 640x480 at 15 fps per stream, CPU")
fig.tight_layout(); fig.savefig(sys.argv[2], dpi=90)
"""
    out = RESULTS / "scaling.png"
    done = subprocess.run(
        [str(python), "-c", script, json.dumps(table), str(out)],
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    return f"wrote {out.relative_to(ROOT)}" if done.returncode == 0 else done.stderr[-300:]


def main() -> None:
    parser = bench_parser((__doc__ or "").splitlines()[0])
    parser.add_argument("--counts", help="comma-separated stream counts (default 1,2,4,8,16)")
    parser.add_argument("--rounds", type=int, help="rounds (default 3; quick 1)")
    parser.add_argument("--seconds", type=float, help="measured window, s (default 10; quick 5)")
    parser.add_argument("--warmup", type=float, default=2.0, help="s after the first results")
    parser.add_argument("--no-plot", action="store_true", help="skip bench/results/scaling.png")
    args = parser.parse_args()
    counts = [int(c) for c in (args.counts or ("1,4,8" if args.quick else "1,2,4,8,16")).split(",")]
    rounds, args.seconds = (
        args.rounds or (1 if args.quick else 3),
        args.seconds or (5.0 if args.quick else 10.0),
    )
    LOGS.mkdir(parents=True, exist_ok=True)
    got_rounds: Rounds = [{} for _ in range(rounds)]
    with (
        tempfile.TemporaryDirectory() as tmp,
        ClockCamera(WIDTH, HEIGHT, FPS, workdir=Path(tmp)) as camera,
    ):
        for r, order in enumerate(rotations([str(c) for c in counts], rounds)):
            for count in map(int, order):
                got = run_count(camera, count, args, LOGS / f"scaling-{count}-{r}.log")
                print(f"round {r + 1}, {count:>2} streams: {got}", flush=True)
                if not isinstance(got, str):
                    got_rounds[r][count] = got
    metrics, table = aggregate(got_rounds)
    judged = verdicts(got_rounds, metrics)
    targets = {
        "mb_per_extra_stream": f"<= {MB_PER_STREAM_TARGET} (CI95 high)",
        "fairness_at_max": f">= {FAIRNESS_TARGET} (CI95 low)",
    }
    print(f"\n{'streams':>7} {'total fps':>10} {'per stream':>11} {'fairness':>9} "
          f"{'p50 ms':>8} {'p99 ms':>8} {'batch':>6} {'RSS MB':>7} {'threads':>8}")  # fmt: skip
    for shown, row in table.items():
        cells = [row.get(k) for k in ("total_fps", "stream_fps", "fairness", "p50_ms",
                                      "p99_ms", "mean_batch", "rss_mb", "threads")]  # fmt: skip
        print(f"{shown:>7} " + " ".join(f"{'-' if c is None else c:>9}" for c in cells))
    if not args.no_plot and not args.quick:
        print(plot(table))
    report(
        "scaling",
        metrics,
        targets,
        {k: v.met for k, v in judged.items()},
        method=how(counts, rounds, args),
        verdicts={k: v.as_json() for k, v in judged.items()},
    )


if __name__ == "__main__":
    main()
