"""Profiling overhead: what continuous profiling and a profiling window with ONNX
Runtime's operators cost one saturated stream (`people_counter` on the bundled clip,
`pace: fast`), with the appliance's default profiling settings.

The verdict comes from crossover phases inside one process (bench/_crossover.py): each
variant and off alternate every 30 frames, in an order that cancels both the clip's
content and the machine's drift, for `cycles` rounds; the figure is the median of the
pair ratios with a bootstrap 95 % interval. A target is met only when the interval's
lower bound clears it. Targets: continuous >= 0.98 of off; a window with operators
>= 0.90 of off. The same pairs give each kind of thread's CPU per frame, the direct
measure of where the cost lands. The rolling writer's CPU per traced frame is charged
to every arm in full, since it writes a second's events during the next second, which
pairs may count as off. A third arm (full run only) profiles every batch:
ONNX Runtime's profiler's own cost on a run it records, the floor that sampling divides.

The arms of a crossover round take their turns in an order rotated by one each round
(bench/_compare.py's `rotations`); the verdict is `judge` on the pair ratios.

The full run adds fresh processes, alternating (`alternate`: each variant takes each
place in turn): whole runs, a window's start and end included; the median of their
ratios against the same round's off run, with its interval and min-max, reported beside
the verdict (no target: 5 rounds of runs that swing by ±20 % cannot show 2 %).
`--quick` runs 1 crossover round and no fresh processes; its interval says what that buys.
"""

from __future__ import annotations

import json
import os
import statistics
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from _common import ROOT, parse_args, report
from _compare import Verdict, alternate, judge, method, ratios, rotations
from _crossover import SEGMENT, Arm, FrameClock, crossover, median, thread_cpu_ns

from appliance.config import parse_config
from appliance.profiling.ort_profile import profiling_session
from appliance.profiling.sampling import SampledSessions
from appliance.runtime.runtime import Runtime

CLIP = ROOT / "configs" / "media" / "demo.mp4"
WORKFLOW = ROOT / "configs" / "workflows" / "people_counter.yaml"
WARMUP_FRAMES = 30  # not measured: model warm-up, a window's session being created
END_MARGIN_FRAMES = 10  # a run's last frames, not measured (its threads start ending)


CPU_BY_THREAD: dict[str, list[dict[str, float]]] = {}  # variant -> per run, ms/frame
# The threads a profiling cost can land on: the tracer's hooks run on the stream's
# grabber and worker and on the model's batcher; the writer has its own; ORT's pools and
# a window's profiled session are "native".
PROFILED_THREADS = ("work", "grab", "batch", "trace-writer", "native")


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
              (not window or all(b.chooser for b in runtime.models.values())))  # fmt: skip
        start, count, cpu0 = time.perf_counter(), stream.rate.count, thread_cpu_ns()
        # Measured to a few frames before the end, while every thread is still alive
        # (an ended thread's CPU leaves /proc with it).
        _wait(lambda: stream.rate.count >= count + frames - END_MARGIN_FRAMES, 600.0)
        done, last, cpu1 = stream.rate.count - count, stream.last_result_mono, thread_cpu_ns()
        rate = done / (last - start)
        if not runtime.wait_done(timeout=600):
            raise SystemExit("run did not finish")
        if label:
            per_frame = {k: (cpu1[k] - cpu0.get(k, 0)) / 1e6 / done for k in cpu1}
            CPU_BY_THREAD.setdefault(label, []).append(per_frame)
    finally:
        runtime.stop()
    # The window's end (reading ORT's operator profile, writing the merged trace) goes on
    # after the stop: let it finish, or it would slow the next run down.
    _wait(lambda: not runtime.profiler.windows.active)
    return rate


def _wait(done: Any, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while not done() and time.monotonic() < deadline:
        time.sleep(0.01)


def tracing_us_per_frame(frames: int = 20_000) -> float:
    """The profiler's own cost per frame, measured directly (deterministic, unlike fps on
    a noisy machine): the spans of a 4-block workflow and of its model batch, then the
    drain and the JSON writing of those events, as the rolling writer does them."""
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


def crossover_arms(
    folder: Path, cycles: int, floor: bool, window_s: float
) -> tuple[dict[str, Arm], dict[str, Any]]:
    """Continuous profiling and a window's ORT sampling, each against off, in crossover
    phases inside one process (bench/_crossover.py), with the default profiling settings.
    Continuous gets two turns a round (its target, 2 %, needs the narrower interval).
    The window arm samples as a window does: every `ort_sample_every_n_batches`-th batch
    on a profiled session of its own, made afresh for each turn (a window's first runs
    are cold too). With `floor`, the first four rounds add an arm that profiles every
    batch: ORT's own cost on a run it records. Then a real 10 s window with operators
    of `window_s` is timed from its end to its trace."""
    doc = {
        "profiling": {"dir": "traces"},
        "streams": [
            {"id": "bench", "source": {"url": str(CLIP), "pace": "fast", "loop": True},
             "workflow": str(WORKFLOW)}
        ],
    }  # fmt: skip
    config = parse_config(doc, folder)
    every_n = config.profiling.ort_sample_every_n_batches
    runtime = Runtime(config)
    clock = FrameClock()
    runtime.subscribe(clock, "bench")  # before the first frame: frame k is clip frame k
    runtime.start()
    tracer = runtime.profiler.tracer

    def tracing(on: bool) -> None:
        tracer.enabled = on

    @contextmanager
    def continuous() -> Iterator[Callable[[bool], None]]:
        yield tracing

    def sampling(n: int, max_runs: int) -> Any:
        @contextmanager
        def arm() -> Iterator[Callable[[bool], None]]:
            twins = {
                batcher: profiling_session(
                    batcher.model, runtime.pool.session_spec(model_id), folder, spin=False
                )
                for model_id, batcher in runtime.models.items()
            }

            def to(on: bool) -> None:
                tracing(on)
                for batcher, twin in twins.items():
                    batcher.choose_sessions(SampledSessions(twin, n, max_runs) if on else None)

            try:
                yield to
            finally:
                for twin in twins.values():
                    Path(twin.end_profiling()).unlink(missing_ok=True)

        return arm

    arms = {
        "continuous": continuous,
        "window": sampling(every_n, config.profiling.ort_max_runs_per_window),
        "window_every_batch": sampling(1, 1 << 31),
    }
    schedule = crossover_schedule(cycles, floor)
    tracing(False)
    try:
        clock.wait_for(WARMUP_FRAMES)
        writer_ns = thread_cpu_ns().get("trace-writer", 0)
        result = crossover(clock, arms, schedule)
        writer_ns = thread_cpu_ns().get("trace-writer", 0) - writer_ns
        tracing(True)
        started = time.perf_counter()
        window = runtime.start_profiling(window_s, None, ort_operators=True)
        _wait(lambda: not runtime.profiler.windows.active, window_s + 60.0)
        end_s = time.perf_counter() - started - window_s
        trace = json.loads(runtime.profiling_trace(window.id).read_text())
    finally:
        runtime.stop()
    if not floor:
        del result["window_every_batch"]
    # The writer's CPU per traced frame, over the whole crossover: it writes a second's
    # events in the next second, so pairs credit part of it to off (see below).
    traced = 2 * SEGMENT * sum(len(arm.ratios) for arm in result.values())
    extra = {
        "every_n": every_n,
        "window_end_s": end_s,
        "writer_ms_per_traced_frame": writer_ns / 1e6 / traced,
        **trace["otherData"]["operators"],
    }
    return result, extra


ARMS = ("continuous", "window", "continuous")  # continuous twice: the narrower interval
FLOOR_ROUNDS = 4  # rounds with the every-batch arm (full run)
TARGETS = {"continuous_vs_off": 0.98, "window_vs_off": 0.90}
VARIANTS: dict[str, tuple[dict[str, Any], bool]] = {  # fresh runs: profiling, a window
    "off": ({"enabled": False}, False),
    "continuous": ({"dir": "traces"}, False),
    "window": ({"dir": "traces"}, True),
}


def crossover_schedule(cycles: int, floor: bool) -> list[list[str]]:
    """Each round's arms, in an order rotated by one each round; with `floor`, the
    every-batch arm joins the first FLOOR_ROUNDS rounds."""
    plain = rotations(ARMS, cycles)
    with_floor = rotations([*ARMS, "window_every_batch"], cycles)
    return [with_floor[c] if floor and c < FLOOR_ROUNDS else plain[c] for c in range(cycles)]


def fresh_runs(folder: Path, rounds: int) -> dict[str, list[float]]:
    """Whole runs in fresh processes (a window's start and end included), the variants
    alternating with their order rotated each round: fps per variant per round."""

    def run(name: str) -> Callable[[], float]:
        profiling, with_window = VARIANTS[name]
        return lambda: fps(300, profiling, folder, window=with_window, label=name)

    def shown(r: int, got: dict[str, list[float]]) -> None:
        print(f"round {r + 1}: " + ", ".join(f"{n} {v[-1]:.1f}" for n, v in got.items()) + " fps")

    return alternate({name: run(name) for name in VARIANTS}, rounds, shown)


def crossover_metrics(
    arms: dict[str, Arm], window: dict[str, Any]
) -> tuple[dict[str, Any], dict[str, Verdict]]:
    """Each arm's pair ratios less the writer's share: the figures and their verdicts."""
    metrics: dict[str, Any] = {"crossover_pairs": len(arms["continuous"].ratios)}
    verdicts: dict[str, Verdict] = {}
    for name, arm in arms.items():
        # The rolling writer turns a second's events into JSON during the next second,
        # which is often an off phase: pairs credit that work to off. Charged here in
        # full instead, as its share of the machine's time per frame (2 cores), so the
        # figure cannot flatter (it may count part of the writer twice).
        share = window["writer_ms_per_traced_frame"] / (
            (os.cpu_count() or 1) * median(arm.off_frame_s) * 1000
        )
        key = f"{name}_vs_off"
        verdict = judge([r - share for r in arm.ratios], at_least=TARGETS.get(key))
        if key in TARGETS:
            verdicts[key] = verdict
        metrics[key] = round(verdict.median, 4)
        metrics[f"{key}.ci95"] = f"{verdict.low:.4f}-{verdict.high:.4f}"
        metrics[f"{key}.worst_pair"] = round(min(arm.ratios) - share, 3)
        metrics[f"{key}.writer_charged"] = round(share, 4)
        for kind in PROFILED_THREADS:
            cpu = judge(arm.cpu_delta_ms.get(kind, [0.0]))
            metrics[f"{name}.cpu_ms_per_frame.{kind}"] = (
                f"{cpu.median:+.3f} [{cpu.low:+.3f}, {cpu.high:+.3f}]"
            )
    return metrics, verdicts


def fresh_metrics(got: dict[str, list[float]]) -> dict[str, Any]:
    """The fresh runs' ratios against the same round's off run, and CPU by thread."""
    metrics: dict[str, Any] = {}
    for key in ("continuous", "window"):
        values = ratios(got[key], got["off"])
        ratio = judge(values)
        metrics[f"fresh_runs.{key}_vs_off"] = round(ratio.median, 3)
        metrics[f"fresh_runs.{key}_vs_off.ci95"] = f"{ratio.low:.3f}-{ratio.high:.3f}"
        metrics[f"fresh_runs.{key}_vs_off.range"] = f"{min(values):.3f}-{max(values):.3f}"
    metrics["fresh_runs.off_fps"] = round(statistics.median(got["off"]), 2)
    for variant, runs in CPU_BY_THREAD.items():
        for kind in sorted({k for r in runs for k in r}):
            value = statistics.median(r.get(kind, 0.0) for r in runs)
            metrics[f"fresh_runs.cpu_ms_per_frame.{variant}.{kind}"] = round(value, 2)
    return metrics


def how(cycles: int, floor: bool, rounds: int, pairs: dict[str, int]) -> dict[str, Any]:
    """The results file's `method`."""
    every = f"; window_every_batch in the first {FLOOR_ROUNDS}" if floor else ""
    return method(
        "throughput of one saturated people_counter stream (the bundled clip, pace: fast) "
        "with each profiling variant against off, switched inside one process",
        ["off", *dict.fromkeys(ARMS), *(["window_every_batch"] if floor else [])],
        cycles,
        "each variant arm in turn (continuous twice" + every + "), each for two loops of "
        "the clip in crossover: 30-frame segments alternating variant and off, the "
        "second loop starting with off; a segment's first 3 frames not timed",
        figure="median of the pair ratios: for neighbouring segments j, j+1, "
        "sqrt(t_off(A,j+1)/t_var(A,j) x t_off(B,j)/t_var(B,j+1)), each segment's content "
        "once on each side and the machine's state a second apart (both cancel); less "
        "the trace writer's CPU share per traced frame, charged in full",
        order="in one run: the variant arms take turns in an order rotated by one each "
        "round; within a turn, variant and off alternate every 30 frames, the second loop "
        "starting with off",
        pairs=pairs,
        fresh_runs=(
            f"{rounds} rounds of 300-frame runs in fresh processes, off, continuous and a "
            "window alternating (order rotated each round); median of the ratios to the "
            "same round's off run, with interval and range; reported, no verdict"
            if rounds
            else "not run (--quick)"
        ),
    )


def main() -> None:
    args = parse_args(__doc__.splitlines()[0])
    rounds, cycles, window_s = (0, 1, 3.0) if args.quick else (5, 12, 10.0)
    floor = not args.quick
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        arms, window = crossover_arms(folder / "crossover", cycles, floor, window_s)
        got = fresh_runs(folder, rounds) if rounds else {}
    metrics, verdicts = crossover_metrics(arms, window)
    metrics["window.every_n_batches"] = window["every_n"]
    metrics["window.runs_profiled"] = window["runs"]
    metrics["window.operators"] = window["operators"]
    metrics["window.seconds"] = window_s
    # From the window's planned end to its trace written: ORT's profile read, operators
    # placed, the file written (off the streams' threads; the GIL held briefly).
    metrics["window.end_s"] = round(window["window_end_s"], 3)
    metrics["tracing_us_per_frame"] = round(tracing_us_per_frame(), 2)
    if got:
        metrics |= fresh_metrics(got)
    report(
        "profiling_overhead",
        metrics,
        {k: f">= {v} (CI95 low)" for k, v in TARGETS.items()},
        {k: v.met for k, v in verdicts.items()},
        method=how(cycles, floor, rounds, {n: len(a.ratios) for n, a in arms.items()}),
        verdicts={k: v.as_json() for k, v in verdicts.items()},
    )


if __name__ == "__main__":
    main()
