"""Profiling overhead: the same stream and workflow with profiling off, with continuous
profiling on (spans for every frame, block and batch, rolling trace files written every
second, histograms), and with a profiling window open as well; run back to back, each
variant taking each place in the order in turn; the median of per-round ratios, with
their min–max. A target is met only when the worst round meets it.

Target: continuous ≥ 0.98 of off. Since fps on a shared 2-core machine swings by tens of
per cent between rounds, the profiler's own cost per frame is also measured directly and
set against the frame time (`estimated_overhead_pct`). The third run has a profiling
window with ONNX Runtime's operator profiler on for the whole run. Target: ≥ 0.90 of off.
"""

from __future__ import annotations

import os
import statistics
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
from _common import ROOT, parse_args, report

from appliance.config import parse_config
from appliance.runtime import Runtime

CLIP = ROOT / "configs" / "media" / "demo.mp4"
WORKFLOW = ROOT / "configs" / "workflows" / "people_counter.yaml"
WARMUP_FRAMES = 30  # not measured: model warm-up, a window's session being created
SETTLE_S = 0.3  # after switching the tracer, before a phase is measured
END_MARGIN_FRAMES = 10  # a run's last frames, not measured (its threads start ending)


CPU_BY_THREAD: dict[str, list[dict[str, float]]] = {}  # variant -> per run, ms/frame


def _thread_cpu() -> dict[str, float]:
    """CPU seconds of every thread of this process (/proc), by Python thread name with its
    stream or model suffix dropped ("work", "batch", "trace-writer"); threads Python did
    not start (ONNX Runtime's pools, FFmpeg's) count as "native"."""
    names = {t.native_id: t.name.split(":")[0] for t in threading.enumerate()}
    tick = os.sysconf("SC_CLK_TCK")
    out: dict[str, float] = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            stat = Path(f"/proc/self/task/{tid}/stat").read_text()
        except OSError:
            continue  # the thread ended meanwhile
        fields = stat[stat.rindex(")") + 2 :].split()
        name = names.get(int(tid), "native")
        out[name] = out.get(name, 0.0) + (int(fields[11]) + int(fields[12])) / tick
    return out


def fps(
    frames: int, profiling: dict[str, Any], folder: Path, window: bool = False, label: str = ""
) -> float:
    """Frames per second in the steady state: from the 30th frame (and, with a window,
    from when its profiled sessions are in place) to the last. With `label`, the CPU per
    frame of each kind of thread over the same span goes to CPU_BY_THREAD[label]."""
    doc = {
        "profiling": profiling,
        "streams": [
            {"id": "bench", "source": {"url": str(CLIP), "pace": "fast", "loop": True},
             "workflow": str(WORKFLOW)}
        ],
    }  # fmt: skip
    runtime = Runtime(parse_config(doc, folder), max_frames=frames + WARMUP_FRAMES)
    runtime.start()
    stream = runtime.streams["bench"]
    try:
        if window:  # a window with ONNX Runtime operators over the whole run
            runtime.start_profiling(300, None, ort_operators=True)
        _wait(lambda: stream.rate.count >= WARMUP_FRAMES and
              (not window or all(b.profiling for b in runtime.models.values())))  # fmt: skip
        start, count, cpu0 = time.perf_counter(), stream.rate.count, _thread_cpu()
        # Measured to a few frames before the end, while every thread is still alive
        # (an ended thread's CPU leaves /proc with it).
        _wait(lambda: stream.rate.count >= count + frames - END_MARGIN_FRAMES, 600.0)
        done, last, cpu1 = stream.rate.count - count, stream.last_result_mono, _thread_cpu()
        rate = done / (last - start)
        if not runtime.wait_done(timeout=600):
            raise SystemExit("run did not finish")
        if label:
            per_frame = {k: (cpu1[k] - cpu0.get(k, 0.0)) * 1000 / done for k in cpu1}
            CPU_BY_THREAD.setdefault(label, []).append(per_frame)
    finally:
        runtime.stop()
    # The window's end (reading ORT's operator profile, writing the merged trace) goes on
    # after the stop: let it finish, or it would slow the next run down.
    _wait(lambda: not runtime.profiler.windows.active)
    return rate


def paired_ratios(folder: Path, seconds: float, phase_s: float) -> list[float]:
    """Continuous tracing on against off inside one process, so that both see the same
    machine state: the tracer is switched every `phase_s` seconds, and each "on" phase's
    fps is divided by the mean of the "off" phases on either side (a linear drift of the
    machine cancels). The stream, its workflow and the rolling writer stay as they are;
    what the switch removes is every span, counter and flow, and the writing of them."""
    doc = {
        "profiling": {"dir": "traces", "rotate_s": 1.0},
        "streams": [
            {"id": "bench", "source": {"url": str(CLIP), "pace": "fast", "loop": True},
             "workflow": str(WORKFLOW)}
        ],
    }  # fmt: skip
    runtime = Runtime(parse_config(doc, folder))
    runtime.start()
    stream, tracer = runtime.streams["bench"], runtime.profiler.tracer
    phases: list[float] = []
    try:
        _wait(lambda: stream.rate.count >= WARMUP_FRAMES)
        for k in range(max(3, int(seconds / phase_s)) | 1):  # odd: off, on, off, ..., off
            tracer.enabled = k % 2 == 1
            time.sleep(SETTLE_S)  # frames under way finish in the new state
            count, start = stream.rate.count, time.perf_counter()
            time.sleep(phase_s)
            phases.append((stream.rate.count - count) / (time.perf_counter() - start))
    finally:
        runtime.stop()
    return [phases[k] / ((phases[k - 1] + phases[k + 1]) / 2) for k in range(1, len(phases), 2)]


def _median_interval(values: list[float], level: float = 0.95) -> tuple[float, float]:
    """A bootstrap interval of the median (10 000 resamples, fixed seed)."""
    rng = np.random.default_rng(0)
    data = np.asarray(values)
    medians = np.median(rng.choice(data, (10_000, len(data))), axis=1)
    tail = (1 - level) / 2 * 100
    return float(np.percentile(medians, tail)), float(np.percentile(medians, 100 - tail))


def _wait(done: Any, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while not done() and time.monotonic() < deadline:
        time.sleep(0.01)


def tracing_us_per_frame(frames: int = 20_000) -> float:
    """The profiler's own cost per frame, measured directly (deterministic, unlike fps on
    a noisy machine): the spans of a 4-block workflow and of its model batch, then the
    drain and the JSON writing of those events, as the rolling writer does them."""
    import json
    import time

    import numpy as np

    from appliance.models.batcher import BatchRecord
    from appliance.profiling.hooks import StreamTrace, trace_batch
    from appliance.profiling.tracer import Tracer
    from pipelines.types import FrameResult

    class Flow:  # the four blocks of people_counter.yaml
        name = "people_counter"
        block_ids = ("people", "tracks", "crossings", "drawn")
        block_types = ("detect", "track", "line_counter", "annotate")

    tracer = Tracer()
    trace = StreamTrace(tracer, "bench", Flow)  # type: ignore[arg-type]
    trace.bind()
    t = time.perf_counter()
    spans = [(t + i * 1e-3, t + i * 1e-3 + 5e-4) for i in range(4)]
    result = FrameResult(
        "bench", 1, None, t, t, t, t + 0.01, np.zeros((1, 1, 3), np.uint8), {}, spans
    )
    record = BatchRecord("person", 1, ("bench",), (0.001,), t, 0.02)
    start = time.perf_counter()
    for _ in range(frames):
        trace(result)
        trace_batch(tracer, record)
    events = tracer.drain()
    json.dumps({"traceEvents": events}, separators=(",", ":"))
    return (time.perf_counter() - start) / frames * 1e6


def main() -> None:
    args = parse_args(__doc__.splitlines()[0])
    frames, rounds = (60, 3) if args.quick else (300, 7)
    variants = {
        "off": ({"enabled": False}, False),
        "continuous": ({"dir": "traces", "rotate_s": 1.0}, False),
        "window": ({"dir": "traces", "rotate_s": 1.0}, True),
    }
    got: dict[str, list[float]] = {name: [] for name in variants}
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        for i in range(rounds):
            names = list(variants)
            order = names[i % 3 :] + names[: i % 3]  # each variant takes each slot in turn
            for name in order:
                profiling, window = variants[name]
                got[name].append(fps(frames, profiling, folder, window=window, label=name))
            print(f"round {i + 1}: " + ", ".join(f"{n} {got[n][-1]:.1f}" for n in names) + " fps")
        files = len(list((folder / "traces" / "rolling").glob("*.json")))
        paired = paired_ratios(folder / "paired", *((12.0, 1.0) if args.quick else (60.0, 2.0)))
    paired_lo, paired_hi = _median_interval(paired)
    print(f"paired phases, on/off: {', '.join(f'{r:.3f}' for r in paired)}")
    off, on, win = got["off"], got["continuous"], got["window"]
    ratios = [a / b for a, b in zip(on, off, strict=True)]
    win_ratios = [a / b for a, b in zip(win, off, strict=True)]
    cost_us = tracing_us_per_frame()
    frame_us = 1e6 / statistics.median(off)
    metrics = {
        "tracing_us_per_frame": round(cost_us, 2),
        # From parts (the tracer's cost against a frame's): a hypothesis, not the target.
        "estimated_overhead_pct": round(100 * cost_us / frame_us, 3),
        "rounds": rounds,
        "off_fps_median": round(statistics.median(off), 2),
        "continuous_fps_median": round(statistics.median(on), 2),
        "continuous_vs_off": round(statistics.median(ratios), 3),
        "continuous_vs_off.range": f"{min(ratios):.3f}-{max(ratios):.3f}",
        "window_fps_median": round(statistics.median(win), 2),
        "window_vs_off": round(statistics.median(win_ratios), 3),
        "window_vs_off.range": f"{min(win_ratios):.3f}-{max(win_ratios):.3f}",
        "trace_files_written": files,
        "paired_on_vs_off": round(statistics.median(paired), 4),
        "paired_on_vs_off.ci95": f"{paired_lo:.4f}-{paired_hi:.4f}",
        "paired_phases": len(paired),
    }
    # CPU ms per frame by kind of thread, median over rounds: where the cost lands.
    for variant, runs in CPU_BY_THREAD.items():
        for kind in sorted({k for r in runs for k in r}):
            value = statistics.median(r.get(kind, 0.0) for r in runs)
            metrics[f"cpu_ms_per_frame.{variant}.{kind}"] = round(value, 2)
    # Met only when the worst round clears the target: the median of few rounds of a
    # machine that swings 20 % between states cannot show 2 %.
    report(
        "profiling_overhead",
        metrics,
        {
            "continuous_vs_off": ">= 0.98 (worst round)",
            "window_vs_off": ">= 0.90 (worst round)",
            "paired_on_vs_off": ">= 0.98 (lower bound of the 95 % interval)",
        },
        {
            "continuous_vs_off": min(ratios) >= 0.98,
            "window_vs_off": min(win_ratios) >= 0.90,
            "paired_on_vs_off": paired_lo >= 0.98,
        },
    )


if __name__ == "__main__":
    main()
