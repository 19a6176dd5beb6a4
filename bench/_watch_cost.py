"""bench/regression_watch.py's cost part: what the regression watch costs a saturated CPU.

Two runs of one stream of the people counter on the bundled clip, `pace: fast`, each by
crossover (bench/_crossover.py: the watch's per-frame work, its recorders and own-cost
clocks, on and off every 30 frames), with an arm that switches nothing alternating with
the watch's, round by round (`null`: the same segments and switch calls; what the method
reads where there is no difference):

- **demo**: with its real detector (about 18 ms a frame here). The figures the watch
  costs its own workload, but at this frame time one pair's CPU per frame scatters by
  tenths of a ms (this machine's CPU state moves within a pair), so the interval is wider
  than the target: the null arm reads as much.
- **free**: the same workflow with the detector replaced by a near-free stand-in of the
  same inputs and outputs (bench/_free_models.py; the decoder, tracker, counter and
  annotator run on real-shaped outputs), so frames take a few ms and the watch's µs per
  frame stand out of the noise. The watch's per-frame work does not depend on the model's
  weight: a recorder row per frame and batch, two clock reads per block, four per run.

The verdict: per pair of the free run, the watch's added CPU per frame on the stream's
worker and batcher threads, as a share of both cores at the demo's frame time, plus the
watch thread's own share over the demo run (its probe and comparisons, /proc); the
upper end of its bootstrap interval against the target. Beside it the demo's own figures
and the parts' estimate (each part timed alone: a hypothesis).
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import yaml
from _common import ROOT
from _compare import Verdict, judge
from _crossover import Arm, FrameClock, crossover, median, thread_cpu_ns
from _free_models import free_tf_od

from appliance.config import load_config
from appliance.models.threads import block_cpu_ns, threads_cpu_ns
from appliance.runtime.runtime import Runtime
from appliance.watch.recorder import StreamRecorder
from pipelines.types import FrameResult

COST_TARGET_PCT = 0.5
COST_FIGURE = (
    "per pair of the free run's segments: the watch's added CPU per frame on the stream's "
    "worker and batcher threads, as a share of both cores at the demo's frame time, plus "
    "the watch thread's CPU share over the demo run (bench/_watch_cost.py), percent"
)
WORKFLOW = "workflows/people_counter.yaml"
REAL_MODEL = "../models/person_ssdlite.onnx"  # as the workflow names it
FREE_ROUNDS = 3  # the free run's rounds per demo round: its frames are a few ms


@dataclass(frozen=True, slots=True)
class CostRun:
    watch: Arm
    null: Arm
    thread_pct: float  # the watch thread's CPU over the run, % of all cores
    wall_s: float
    comparisons: int
    blocks: int


def cost(tmp: Path, cycles: int, watch: dict[str, Any]) -> tuple[dict[str, Any], Verdict]:
    """Both runs; the figures and the verdict (see the top)."""
    demo = cost_run(tmp / "cost", cycles, watch, free=False)
    free = cost_run(tmp / "cost-free", FREE_ROUNDS * cycles, watch, free=True)
    cores = len(os.sched_getaffinity(0))
    frame_s = median(demo.watch.off_frame_s)
    to_pct = 100 / 1000 / frame_s / cores  # ms of CPU per frame -> % of all cores
    out: dict[str, Any] = {
        "cost.thread_pct_of_cpu": round(demo.thread_pct, 4),
        "cost.run_s": round(demo.wall_s + free.wall_s, 1),
        "cost.comparisons": demo.comparisons,
        "cost.frame_ms": round(frame_s * 1000, 2),
    }
    added = crossover_figures(out, "cost", demo.watch)
    crossover_figures(out, "cost.null", demo.null)
    out["cost.recorders_pct_of_cpu.ci95_high"] = round(max(judge(added).high, 0.0) * to_pct, 4)
    free_added = crossover_figures(out, "cost.free", free.watch)
    crossover_figures(out, "cost.free.null", free.null)
    out["cost.free.frame_ms"] = round(median(free.watch.off_frame_s) * 1000, 3)
    us = judge([a * 1000 for a in free_added])
    out["cost.free.added_us_per_frame"] = f"{us.median:+.1f} [{us.low:+.1f}, {us.high:+.1f}]"
    out |= parts_estimate(demo.blocks, to_pct)
    verdict = judge([demo.thread_pct + a * to_pct for a in free_added], at_most=COST_TARGET_PCT)
    out["cost.total_pct_of_cpu"] = round(max(verdict.high, demo.thread_pct), 4)
    return out, verdict


def cost_run(folder: Path, rounds: int, watch: dict[str, Any], free: bool) -> CostRun:
    """One stream of the people counter (its detector near-free with `free`), the watch's
    arm and the null arm alternating for `rounds` rounds each way."""
    config = _config(folder, watch, free)
    rt = Runtime(load_config(config), config_path=config)
    clock = FrameClock()
    rt.subscribe(clock, "bench")
    rt.start()
    never = float("inf")

    def switch(on: bool) -> None:
        recorder = rt.watch._streams["bench"].recorder
        recorder.skip_until = 0.0 if on else never
        rt.watch.models.paused_until = 0.0 if on else never
        # The own-cost clocks the watch asks for: each block's CPU on the worker thread,
        # and each run's on the batcher's (appliance/watch/contention.py).
        run = rt.streams.find("bench").workflow_run
        if run is not None:
            run.measure_cpu(on)
        for batcher in rt.pool.handles.values():
            batcher.measure_cpu = on

    @contextmanager
    def arm() -> Iterator[Callable[[bool], None]]:
        yield switch

    @contextmanager
    def null() -> Iterator[Callable[[bool], None]]:
        yield lambda _on: None  # the same segments and switches, nothing switched

    try:
        clock.wait_for(30)
        switch(False)
        wall0, cpu0 = time.monotonic(), thread_cpu_ns().get("watch", 0)
        schedule = [["watch", "null"], ["null", "watch"]] * rounds
        result = crossover(clock, {"watch": arm, "null": null}, schedule)
        wall = time.monotonic() - wall0
        thread_ns = thread_cpu_ns().get("watch", 0) - cpu0
        comparisons = rt.regressions().comparisons
        blocks = len(rt.watch._streams["bench"].recorder.block_ids)
    finally:
        rt.stop(10.0)
    thread_pct = 100 * thread_ns / 1e9 / wall / len(os.sched_getaffinity(0))
    return CostRun(result["watch"], result["null"], thread_pct, wall, comparisons, blocks)


def _config(folder: Path, watch: dict[str, Any], free: bool) -> Path:
    folder.mkdir()
    for name in ("models", "media", "workflows"):
        (folder / name).symlink_to(ROOT / "configs" / name)
    workflow = WORKFLOW
    if free:  # the shipped workflow with its detector's path pointed at the stand-in
        (folder / "free").mkdir()
        free_tf_od(folder / "free" / "person.onnx")
        text = (ROOT / "configs" / WORKFLOW).read_text()
        assert REAL_MODEL in text, f"{WORKFLOW} no longer names {REAL_MODEL}"
        free_workflow = text.replace(REAL_MODEL, "person.onnx")
        (folder / "free" / "people_counter.yaml").write_text(free_workflow)
        workflow = "free/people_counter.yaml"
    doc = {
        "profiling": {"dir": "traces", "watch": watch},
        "streams": [{"id": "bench", "workflow": workflow,
                     "source": {"url": "media/demo.mp4", "loop": True, "pace": "fast"}}],
    }  # fmt: skip
    config = folder / "config.yaml"
    config.write_text(yaml.safe_dump(doc))
    return config


def crossover_figures(out: dict[str, Any], at: str, arm: Arm) -> list[float]:
    """An arm's pairs as figures under `at`: its throughput against off and the CPU it
    added per frame on the streams' worker and batcher threads (returned, ms per pair)."""
    pairs = len(arm.ratios)
    throughput = judge(arm.ratios)
    out[f"{at}.crossover_pairs"] = pairs
    out[f"{at}.throughput_vs_off"] = round(throughput.median, 4)
    out[f"{at}.throughput_vs_off.ci95"] = f"{throughput.low:.4f}-{throughput.high:.4f}"
    added = [sum(arm.cpu_delta_ms.get(k, [0.0] * pairs)[i] for k in ("work", "batch"))
             for i in range(pairs)]  # fmt: skip
    cpu = judge(added)
    out[f"{at}.recorders_cpu_ms_per_frame"] = f"{cpu.median:+.4f} [{cpu.low:+.4f}, {cpu.high:+.4f}]"
    return added


def parts_estimate(blocks: int, to_pct: float) -> dict[str, Any]:
    """What the watch's per-frame work costs by its parts, each timed alone here: a
    hypothesis, not the verdict (a part timed in a loop misses what it does to the code
    around it). Per frame of the people counter: the stream recorder's row, two CPU clock
    reads per block, and per model run two of the calling thread and two of its one pool
    thread (the batch record's ring row is left out: the stream's row bounds it)."""
    n = 20_000
    recorder = StreamRecorder("s", [f"b{i}" for i in range(blocks)], 4096)
    result = FrameResult(stream_id="s", seq=0, pts=None, capture_time=0.0, capture_mono=0.4,
                         start_mono=0.5, done_mono=1.0, image=np.zeros((2, 2, 3), np.uint8),
                         outputs={}, block_spans=[(0.0, 0.001)] * blocks,
                         block_cpu_ns=(12_345,) * blocks)  # fmt: skip
    t0 = time.perf_counter()
    for _ in range(n):
        recorder(result)
    recorder_us = (time.perf_counter() - t0) / n * 1e6
    t0 = time.perf_counter()
    for _ in range(n):
        block_cpu_ns()
    clock_us = (time.perf_counter() - t0) / n * 1e6
    tid = threading.get_native_id()
    t0 = time.perf_counter()
    for _ in range(n):
        threads_cpu_ns((tid,))
    other_us = (time.perf_counter() - t0) / n * 1e6
    per_frame = recorder_us + 2 * blocks * clock_us + 2 * clock_us + 2 * other_us
    return {
        "cost.parts.recorder_us": round(recorder_us, 2),
        "cost.parts.clock_read_us": round(clock_us, 2),
        "cost.parts.us_per_frame": round(per_frame, 1),
        "cost.parts.pct_of_cpu": round(per_frame / 1000 * to_pct, 4),
    }
