"""Exemplars' cost on the frame path: one saturated `people_counter` stream (the bundled
clip, `pace: fast`) with the latency histograms' exemplars on against off, switched
inside one process in crossover phases (bench/_crossover.py, the method of
bench/profiling_overhead.py).

Each 30-frame segment runs with exemplars on or off: the stream switches to metric
children bound either way (`Stream.switch` at a frame boundary, its workflow instance
kept) and the model's batch observer is replaced. Per pair of segments the figure is
CPU per frame, all threads of the process together (/proc schedstat), on over off:

    sqrt( cpu_on(A, j) / cpu_off(A, j+1)  *  cpu_on(B, j+1) / cpu_off(B, j) )

each segment's content on both sides and the machine's state a second apart. Target:
at most 1 % more CPU per frame at the interval's upper end. Throughput (the same pairs'
fps ratio) is reported beside it, without a target.

What the arms cannot switch is charged to both: the worker's one dict store a frame of
the frame in work (`FrameTags.working`). Its cost, and the observe calls' own, are
timed in isolation (`observe_ns.*`): parts, reported as such, not the verdict.
`--quick` runs 1 round (2 loops a round); the full run 12.
"""

from __future__ import annotations

import functools
import math
import tempfile
import timeit
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from _common import ROOT, parse_args, report
from _compare import judge, method, rotations
from _crossover import LOOP, SEGMENT, SETTLE, FrameClock, Segment, run_loops

from appliance.config import parse_config
from appliance.models.observers import batch_observer
from appliance.observe.metrics import Metrics, StreamMetrics
from appliance.runtime.runtime import Runtime
from appliance.runtime.streamparts import Switch
from pipelines.types import FrameResult

CLIP = ROOT / "configs" / "media" / "demo.mp4"
WORKFLOW = ROOT / "configs" / "workflows" / "people_counter.yaml"
WARMUP_FRAMES = 60
TARGET = 1.01  # CPU per frame, on over off: at most, at the interval's upper end
STREAM = "bench"


def switcher(runtime: Runtime) -> Callable[[bool], None]:
    """Exemplars on or off from the stream's next frame and the model's next batch."""
    stream = runtime.streams.find(STREAM)
    metrics = runtime.metrics

    def switch(on: bool) -> None:
        metrics.exemplars = on
        workflow = stream.workflow
        blocks = list(zip(workflow.block_ids, workflow.block_types, strict=True))
        change = Switch(workflow, stream.workflow_run, StreamMetrics(metrics, STREAM, blocks),
                        stream._trace)  # fmt: skip
        stream.switch(change)
        for model_id, batcher in runtime.models.items():
            batcher.on_batch = batch_observer(metrics, model_id, runtime._on_batch)
        change.done.wait(5.0)

    return switch


def cpu_s(segment: Segment) -> float:
    return sum(segment.cpu_ns.values()) / 1e9


def pairs(a: list[Segment], b: list[Segment]) -> tuple[list[float], list[float]]:
    """Loop A (on first) and loop B (off first): per pair, CPU per frame on over off and
    throughput on over off."""
    cpu, fps = [], []
    for j in range(0, len(a) - 1, 2):
        on_a, off_a, off_b, on_b = a[j], a[j + 1], b[j], b[j + 1]
        cpu.append(math.sqrt(cpu_s(on_a) / cpu_s(off_a) * cpu_s(on_b) / cpu_s(off_b)))
        fps.append(math.sqrt(off_a.seconds / on_a.seconds * off_b.seconds / on_b.seconds))
    return cpu, fps


def crossover(folder: Path, rounds: int) -> tuple[list[float], list[float], float]:
    doc = {
        "profiling": {"dir": "traces"},
        "streams": [{"id": STREAM, "source": {"url": str(CLIP), "pace": "fast", "loop": True},
                     "workflow": str(WORKFLOW)}],
    }  # fmt: skip
    runtime = Runtime(parse_config(doc, folder))
    clock = FrameClock()
    runtime.subscribe(clock, STREAM)
    runtime.start()
    cpu: list[float] = []
    fps: list[float] = []
    try:
        clock.wait_for(WARMUP_FRAMES)
        switch = switcher(runtime)
        for r, order in enumerate(rotations(["on_first", "off_first"], rounds)):
            loops = {name: run_loops(clock, switch, name == "on_first") for name in order}
            got_cpu, got_fps = pairs(loops["on_first"], loops["off_first"])
            cpu += got_cpu
            fps += got_fps
            print(f"round {r + 1}/{rounds}: CPU on/off median so far {judge(cpu).median:.4f}",
                  flush=True)  # fmt: skip
        frame_s = (clock.stamps[-1] - clock.stamps[WARMUP_FRAMES]) / (
            len(clock.stamps) - 1 - WARMUP_FRAMES
        )
    finally:
        runtime.stop()
    return cpu, fps, frame_s


def observe_ns() -> dict[str, float]:
    """ns per call of one frame's observe (3 blocks), exemplars off and on, and of the
    worker's store of its frame in work: parts, in isolation."""
    blocks = [("people", "detect"), ("count", "zone_counter"), ("draw", "annotate")]
    out: dict[str, float] = {}
    spans = [(0.0, 0.02), (0.02, 0.021), (0.021, 0.03)]
    results = [
        FrameResult("cam", k, None, 0.0, k * 0.066, k * 0.066, k * 0.066 + 0.03, None, {}, spans)
        for k in range(1000)
    ]
    calls = 20_000
    for on in (False, True):
        observe = StreamMetrics(Metrics(exemplars=on), "cam", blocks).observe
        frames = iter(results * 200)
        seconds = min(timeit.repeat(functools.partial(_one, observe, frames), number=calls,
                                    repeat=5))  # fmt: skip
        out["on" if on else "off"] = round(seconds / calls * 1e9, 1)
    working: dict[str, int] = {}
    store = min(timeit.repeat(lambda: working.__setitem__("cam", 7), number=200_000, repeat=5))
    out["working_store"] = round(store / 200_000 * 1e9, 1)
    return out


def _one(observe: Callable[[FrameResult], None], frames: Iterator[FrameResult]) -> None:
    observe(next(frames))


def main() -> None:
    args = parse_args(__doc__.splitlines()[0])
    rounds = 1 if args.quick else 12
    with tempfile.TemporaryDirectory() as tmp:
        cpu, fps, frame_s = crossover(Path(tmp), rounds)
    verdict = judge(cpu, at_most=TARGET)
    speed = judge(fps)
    parts = observe_ns()
    metrics: dict[str, Any] = {
        "cpu_per_frame_on_vs_off": round(verdict.median, 4),
        "cpu_per_frame_on_vs_off.ci95": f"{verdict.low:.4f}-{verdict.high:.4f}",
        "fps_on_vs_off": round(speed.median, 4),
        "fps_on_vs_off.ci95": f"{speed.low:.4f}-{speed.high:.4f}",
        "pairs": len(cpu),
        "frame_ms": round(frame_s * 1e3, 2),
        "observe_ns.off": parts["off"],
        "observe_ns.on": parts["on"],
        "observe_ns.working_store": parts["working_store"],
        # The parts as a share of a frame's time: a hypothesis beside the measured figure.
        "observe_share_of_frame": round((parts["on"] - parts["off"]) / (frame_s * 1e9), 6),
    }
    report(
        "exemplars",
        metrics,
        {"cpu_per_frame_on_vs_off": f"<= {TARGET} (CI95 high)"},
        {"cpu_per_frame_on_vs_off": verdict.met},
        method=method(
            "CPU per frame of one saturated people_counter stream (the bundled clip, pace: "
            "fast) with the latency histograms' exemplars on against off, switched inside "
            "one process",
            ["on", "off"],
            rounds,
            f"two loops of the clip ({LOOP} frames each) in crossover: {SEGMENT}-frame "
            f"segments alternating on and off, the second loop starting with the other; a "
            f"segment's first {SETTLE} frames not timed",
            figure="median over pairs of sqrt(cpu_on(A,j)/cpu_off(A,j+1) x "
            "cpu_on(B,j+1)/cpu_off(B,j)), CPU of every thread of the process per frame",
            charged_to_both="the worker's store of its frame in work (observe_ns.working_store)",
        ),
        verdicts={"cpu_per_frame_on_vs_off": verdict.as_json()},
    )


if __name__ == "__main__":
    main()
