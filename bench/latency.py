"""Frame age under load: a realtime 30 fps source and a model slower than 30 fps.

The newest-frame design should keep the age of each result (capture → result) near the
model's own latency, never growing with a queue: the worker takes the newest frame, at
most one frame interval old, so a result is one model run plus at most one interval old;
one frame queued ahead of it would add a whole run more. Target: p99 ≤ 2 × model latency
+ one frame interval. The model latency is measured INSIDE the pipeline, in the
same window as the ages: each result's span of the model (`detect`) block
(preprocessing, the batcher's `session.run`, decoding), as the appliance's per-block
latency records it; the batcher's own `session.run` time is reported beside it.

One run of the appliance, measured in consecutive windows (rounds; one arm, so nothing
to alternate: the limit is taken from the same window as the ages). Per round: the p99
of its frame ages ÷ (2 × the median model-block span of its frames + 1 frame interval).
The verdict takes the median of the rounds' ratios with its bootstrap 95 % interval
(bench/_compare.py): met when the interval's upper bound is <= 1.

    python bench/latency.py [--quick]   # quick: 4 rounds of 5 s; full: 12 rounds of 8 s
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from _common import ROOT, detect_stream_config, parse_args, report
from _compare import judge, method

from appliance.config import AppConfig
from appliance.models.batcher import BatchRecord, ModelBatcher
from appliance.runtime.runtime import Runtime
from pipelines.types import FrameResult

FPS = 30
MODEL = ROOT / "configs" / "models" / "centerface.onnx"
INPUT_SIZE = [960, 544]  # CenterFace at this size runs well below 30 fps on 2 CPU cores
WARMUP_S = 3.0  # the first runs pay for ORT's allocations and thread start-up


def make_clip(path: Path, seconds: int) -> None:
    """The demo scene re-encoded at 30 fps (a camera at 30 fps)."""
    sys.path.insert(0, str(ROOT / "configs" / "media"))
    import av
    import make_demo_clip as demo

    images = demo.frames()
    with av.open(str(path), "w") as container:
        stream = container.add_stream("libx264", rate=FPS)
        stream.width, stream.height, stream.pix_fmt = demo.WIDTH, demo.HEIGHT, "yuv420p"
        stream.options = {"preset": "ultrafast", "g": str(FPS), "bf": "0"}
        for i in range(FPS * seconds):
            frame = av.VideoFrame.from_ndarray(images[i % len(images)], format="bgr24")
            for packet in stream.encode(frame):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)


def config(clip: Path) -> AppConfig:
    model = {"path": str(MODEL), "decoder": "centerface", "input_size": INPUT_SIZE}
    source = {"url": str(clip), "pace": "realtime", "loop": True}
    return detect_stream_config("faces", model, "cam", source)


class Window:
    """Per result: its age and its model block's span; per batch: `session.run`'s time.
    Written on the worker and batcher threads, swapped out by `take` between rounds."""

    def __init__(self) -> None:
        self.ages: list[float] = []
        self.spans: list[float] = []
        self.runs: list[float] = []

    def on_result(self, result: FrameResult) -> None:
        span = result.block_spans[0] if result.block_spans else None  # the one block
        if span is not None:
            self.ages.append(result.age_seconds)
            self.spans.append(span[1] - span[0])

    def chain(self, batcher: ModelBatcher) -> None:
        """Record the batcher's runs, before its own hook (the profiler, the watch)."""
        hook = batcher.on_batch

        def on_batch(record: BatchRecord) -> None:
            self.runs.append(record.run_s)
            if hook is not None:
                hook(record)

        batcher.on_batch = on_batch

    def take(self) -> tuple[list[float], list[float], list[float]]:
        got = self.ages, self.spans, self.runs
        self.ages, self.spans, self.runs = [], [], []  # a swap: the threads append to new lists
        return got


def one_round(window: Window, seconds: float) -> dict[str, float]:
    """A window of `seconds` (realtime: the run lasts this long by design): its ages'
    p50/p99, the model block's median span, the limit and the p99's ratio to it (ms)."""
    window.take()
    time.sleep(seconds)
    ages, spans, runs = (np.array(v) * 1000 for v in window.take())
    if ages.size == 0:
        raise SystemExit(f"no result in a {seconds:g} s round")
    model_ms = float(np.median(spans))
    limit = 2 * model_ms + 1000 / FPS
    p99 = float(np.percentile(ages, 99))
    return {
        "frames": float(ages.size),
        "age_p50_ms": float(np.percentile(ages, 50)),
        "age_p99_ms": p99,
        "model_block_ms": model_ms,
        "model_run_ms": float(np.median(runs)) if runs.size else float("nan"),
        "limit_ms": limit,
        "ratio": p99 / limit,
    }


def main() -> None:
    args = parse_args(__doc__.splitlines()[0])
    rounds, seconds = (4, 5.0) if args.quick else (12, 8.0)
    window = Window()
    got: list[dict[str, float]] = []
    with tempfile.TemporaryDirectory() as tmp:
        clip = Path(tmp) / "cam30.mp4"
        make_clip(clip, 10)
        runtime = Runtime(config(clip))
        runtime.start()
        try:
            runtime.subscribe(window.on_result, "cam")
            window.chain(runtime.models["faces"])
            time.sleep(WARMUP_S)
            for r in range(rounds):
                got.append(one_round(window, seconds))
                print(f"round {r + 1}/{rounds}: " + ", ".join(
                    f"{k} {v:.1f}" for k, v in got[-1].items() if k != "ratio"
                ) + f", ratio {got[-1]['ratio']:.3f}", flush=True)  # fmt: skip
            status = runtime.stream_status("cam")
        finally:
            runtime.stop()
    verdict = judge([g["ratio"] for g in got], at_most=1.0)

    def median(key: str) -> float:
        return round(float(np.median([g[key] for g in got])), 2)

    metrics = {
        "age_p99_to_limit": round(verdict.median, 3),
        "age_p99_to_limit.interval": f"{verdict.low:.3f}-{verdict.high:.3f}",
        "frame_age_p50_ms": median("age_p50_ms"),
        "frame_age_p99_ms": median("age_p99_ms"),
        "model_latency_ms": median("model_block_ms"),
        "model_run_ms": median("model_run_ms"),
        "p99_limit_ms": median("limit_ms"),
        "frames_per_round": median("frames"),
        "processed_fps": status.fps,
        "frames_processed": status.frames_processed,
        "frames_dropped": status.frames_dropped,
    }
    how = method(
        f"one appliance stream: the demo scene as a {FPS} fps clip played in real time "
        f"(pace: realtime, loop), CenterFace at {INPUT_SIZE[0]}x{INPUT_SIZE[1]}, one "
        f"`detect` block; after {WARMUP_S:g} s, consecutive {seconds:g} s windows; per "
        "window, from the appliance's own results: each frame's age (capture to result) "
        "and its model block's span, and the batcher's session.run times",
        ["appliance"], rounds, f"a {seconds:g} s window of the one run",
        order="one arm: consecutive windows of one run (the limit is taken in the same "
        "window as the ages, so a slow spell raises both)",
        figure="per round: p99 frame age ÷ (2 × the round's median model-block span + "
        f"{1000 / FPS:.1f} ms); the median of the rounds",
    )  # fmt: skip
    report(
        "latency", metrics,
        {"age_p99_to_limit": "<= 1 (95 % interval's upper bound)"},
        {"age_p99_to_limit": verdict.met},
        method=how, verdicts={"age_p99_to_limit": verdict.as_json()}, rounds=got,
    )  # fmt: skip


if __name__ == "__main__":
    main()
