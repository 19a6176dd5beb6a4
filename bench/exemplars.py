"""Exemplars' cost on the frame path: one saturated `people_counter` stream (the bundled
clip, `pace: fast`) with the latency histograms' exemplars on against off, switched
inside one process in crossover phases (bench/_crossover.py, the method of
bench/profiling_overhead.py). Two workloads: `free`, the detector replaced by a
near-free stand-in of its inputs and outputs (bench/_free_models.py), so a frame's CPU
is the appliance's own work and a cost of its frame path shows against the smallest
denominator (the verdict that counts); and `model`, the real detector, in the full run.

Each 30-frame segment runs with exemplars on or off: the stream switches to metric
children bound either way (`Stream.switch` at a frame boundary, its workflow instance
kept) and the model's batch observer is replaced. Per pair of segments the figure is
CPU per frame, all threads of the process together (/proc schedstat), on over off:

    sqrt( cpu_on(A, j) / cpu_off(A, j+1)  *  cpu_on(B, j+1) / cpu_off(B, j) )

each segment's content on both sides and the machine's state a second apart. Target:
at most 1 % more CPU per frame at the interval's upper end. Throughput (the same pairs'
fps ratio) is reported beside it, without a target.

ONNX Runtime's idle threads do not spin here (APPLIANCE_ORT_SPINNING=0): a spin is CPU
that comes and goes by itself, by a few per cent a segment, and would drown a cost of
hundredths of a per cent; with it off, a frame's CPU is its work.

What the arms cannot switch is charged to both: the worker's one dict store a frame of
the frame in work (`FrameTags.working`). Its cost, and the observe calls' own, are
timed in isolation (`observe_ns.*`): parts, reported as such, not the verdict.
A `null` arm runs the same switch with exemplars off on both sides: what the design
reads when nothing changes (its interval is the noise floor; its median, any bias).
`--quick` runs 3 rounds of `free` (2 loops a round); the full run 48, 24 of `null`
and 16 of `model`.
"""

from __future__ import annotations

import functools
import math
import os
import tempfile
import timeit
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from _common import ROOT, parse_args, report
from _compare import Verdict, judge, method, rotations
from _crossover import LOOP, SEGMENT, SETTLE, FrameClock, Segment, run_loops

from appliance.config import parse_config
from appliance.models.observers import batch_observer
from appliance.models.session import SPINNING_ENV
from appliance.observe.metrics import Metrics, StreamMetrics
from appliance.runtime.runtime import Runtime
from appliance.runtime.streamparts import Switch
from bench._free_models import free_tf_od
from pipelines.types import FrameResult

CLIP = ROOT / "configs" / "media" / "demo.mp4"
WORKFLOW = ROOT / "configs" / "workflows" / "people_counter.yaml"
WARMUP_FRAMES = 60
TARGET = 1.01  # CPU per frame, on over off: at most, at the interval's upper end
STREAM = "bench"


def switcher(runtime: Runtime, null: bool) -> Callable[[bool], None]:
    """Exemplars on or off from the stream's next frame and the model's next batch; with
    `null`, the same switch that leaves them off (the design's own bias and noise)."""
    stream = runtime.streams.find(STREAM)
    metrics = runtime.metrics

    def switch(on: bool) -> None:
        metrics.exemplars = on and not null
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


Kinds = dict[str, list[float]]  # kind of thread -> per pair, on - off, ms per frame


def pairs(a: list[Segment], b: list[Segment], kinds: Kinds) -> tuple[list[float], list[float]]:
    """Loop A (on first) and loop B (off first): per pair, CPU per frame on over off and
    throughput on over off; each kind of thread's difference into `kinds`."""
    cpu, fps = [], []
    frames = SEGMENT - SETTLE
    for j in range(0, len(a) - 1, 2):
        on_a, off_a, off_b, on_b = a[j], a[j + 1], b[j], b[j + 1]
        cpu.append(math.sqrt(cpu_s(on_a) / cpu_s(off_a) * cpu_s(on_b) / cpu_s(off_b)))
        fps.append(math.sqrt(off_a.seconds / on_a.seconds * off_b.seconds / on_b.seconds))
        for kind in {*on_a.cpu_ns, *off_a.cpu_ns, *on_b.cpu_ns, *off_b.cpu_ns}:
            on = on_a.cpu_ns.get(kind, 0) + on_b.cpu_ns.get(kind, 0)
            off = off_a.cpu_ns.get(kind, 0) + off_b.cpu_ns.get(kind, 0)
            kinds.setdefault(kind, []).append((on - off) / 2 / frames / 1e6)
    return cpu, fps


@dataclass
class Arm:
    cpu: list[float] = field(default_factory=list)
    fps: list[float] = field(default_factory=list)
    kinds: Kinds = field(default_factory=dict)
    frame_s: float = 0.0


def free_workflow(folder: Path) -> Path:
    """people_counter.yaml with its detector replaced by a near-free stand-in of the same
    inputs and outputs (bench/_free_models.py): the appliance's own work per frame."""
    doc = yaml.safe_load(WORKFLOW.read_text(encoding="utf-8"))
    doc["models"]["person"]["path"] = str(free_tf_od(folder / "free_tf_od.onnx"))
    path = folder / "people_counter_free.yaml"
    path.write_text(yaml.safe_dump(doc), encoding="utf-8")
    return path


def crossover(folder: Path, rounds: int, workflow: Path, null: bool = False) -> Arm:
    doc = {
        "profiling": {"dir": "traces"},
        "streams": [{"id": STREAM, "source": {"url": str(CLIP), "pace": "fast", "loop": True},
                     "workflow": str(workflow)}],
    }  # fmt: skip
    runtime = Runtime(parse_config(doc, folder))
    clock = FrameClock()
    runtime.subscribe(clock, STREAM)
    runtime.start()
    arm = Arm()
    try:
        clock.wait_for(WARMUP_FRAMES)
        switch = switcher(runtime, null)
        for r, order in enumerate(rotations(["on_first", "off_first"], rounds)):
            loops = {name: run_loops(clock, switch, name == "on_first") for name in order}
            got_cpu, got_fps = pairs(loops["on_first"], loops["off_first"], arm.kinds)
            arm.cpu += got_cpu
            arm.fps += got_fps
            print(f"{workflow.stem}{' null' * null} round {r + 1}/{rounds}: CPU on/off so far "
                  f"{judge(arm.cpu).median:.4f}", flush=True)  # fmt: skip
        arm.frame_s = (clock.stamps[-1] - clock.stamps[WARMUP_FRAMES]) / (
            len(clock.stamps) - 1 - WARMUP_FRAMES
        )
    finally:
        runtime.stop()
    return arm


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


def arm_metrics(name: str, arm: Arm, verdict: Verdict) -> dict[str, Any]:
    speed = judge(arm.fps)
    return {
        f"{name}.cpu_per_frame_on_vs_off": round(verdict.median, 4),
        f"{name}.cpu_per_frame_on_vs_off.ci95": f"{verdict.low:.4f}-{verdict.high:.4f}",
        f"{name}.fps_on_vs_off": round(speed.median, 4),
        f"{name}.fps_on_vs_off.ci95": f"{speed.low:.4f}-{speed.high:.4f}",
        f"{name}.pairs": len(arm.cpu),
        f"{name}.frame_ms": round(arm.frame_s * 1e3, 2),
        **{
            f"{name}.cpu_ms_per_frame.{kind}": f"{d.median:+.3f} [{d.low:+.3f}, {d.high:+.3f}]"
            for kind, d in ((k, judge(v)) for k, v in sorted(arm.kinds.items()))
        },
    }


def main() -> None:
    args = parse_args(__doc__.splitlines()[0])
    rounds = 3 if args.quick else 48
    os.environ[SPINNING_ENV] = "0"  # read when the sessions are made
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        free = free_workflow(folder)
        arms = {"free": crossover(folder / "free", rounds, free)}
        if not args.quick:
            arms["null"] = crossover(folder / "null", rounds // 2, free, null=True)
            arms["model"] = crossover(folder / "model", rounds // 3, WORKFLOW)
    verdicts = {f"{name}.cpu_per_frame_on_vs_off": judge(a.cpu, at_most=TARGET)
                for name, a in arms.items() if name != "null"}  # fmt: skip
    verdicts_null = {f"{n}.cpu_per_frame_on_vs_off": judge(a.cpu) for n, a in arms.items()
                     if n == "null"}  # fmt: skip
    parts = observe_ns()
    metrics: dict[str, Any] = {}
    for name, arm in arms.items():
        key = f"{name}.cpu_per_frame_on_vs_off"
        metrics |= arm_metrics(name, arm, verdicts.get(key) or verdicts_null[key])
    metrics |= {
        "observe_ns.off": parts["off"],
        "observe_ns.on": parts["on"],
        "observe_ns.working_store": parts["working_store"],
        # The parts as a share of a free frame's time: a hypothesis beside the measure.
        "observe_share_of_frame": round(
            (parts["on"] - parts["off"]) / (arms["free"].frame_s * 1e9), 6
        ),
    }
    report(
        "exemplars",
        metrics,
        {k: f"<= {TARGET} (CI95 high)" for k in verdicts},
        {k: v.met for k, v in verdicts.items()},
        method=method(
            "CPU per frame of one saturated people_counter stream (the bundled clip, pace: "
            "fast) with the latency histograms' exemplars on against off, switched inside "
            "one process: `free`, its detector a near-free stand-in (the appliance's own "
            "work per frame, the harsher denominator); `null`, the same switch with "
            "exemplars off on both sides (half the rounds: the noise floor and any bias of "
            "the design); `model`, the real detector (a third of the rounds); `null` and "
            "`model` in the full run only",
            ["on", "off"],
            rounds,
            f"two loops of the clip ({LOOP} frames each) in crossover: {SEGMENT}-frame "
            f"segments alternating on and off, the second loop starting with the other; a "
            f"segment's first {SETTLE} frames not timed",
            figure="median over pairs of sqrt(cpu_on(A,j)/cpu_off(A,j+1) x "
            "cpu_on(B,j+1)/cpu_off(B,j)), CPU of every thread of the process per frame",
            charged_to_both="the worker's store of its frame in work (observe_ns.working_store)",
            spinning="off (APPLIANCE_ORT_SPINNING=0): idle ORT threads' spin is noise here",
        ),
        verdicts={k: v.as_json() for k, v in verdicts.items()},
    )


if __name__ == "__main__":
    main()
