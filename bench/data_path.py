"""The data path: CPU per frame on the worker and batcher threads, today's path against the new.

Arms: `today` is `preprocess: host` (numpy makes the float tensor on the stream's
thread) with `batching.inline: false` (every sample goes through the batcher thread);
`new` is the defaults (`inline: true`; `preprocess: auto`, which is the host on a CPU);
`graph` is `preprocess: graph` with inline runs (ONNX Runtime makes the float tensor).
Measured side by side in one run, the arms alternating with the order rotated each
round (bench/_compare.py).

CPU per frame: one stream, the demo clip (960x540, `pace: fast`: every frame, no drops)
through CenterFace (`faces`) and the person detector (`people`), each arm a fresh
Runtime. Snapshots on the stream's worker thread after `skip` results and again `frames`
later read the CPU clocks of the threads `work:<stream>` and `batch:<model>`
(`pthread_getcpuclockid`: /proc/self/task/<tid>/stat's utime + stime, in ns rather than
10-ms ticks, on the clock `time.thread_time()` reads inside `session.run`, so (b) takes
like from like), their CPU inside `session.run`, and the process's CPU. Per frame:
- (a) CPU on the worker + batcher threads;
- (b) (a) less the CPU inside `session.run` on those threads (ONNX Runtime's caller
  thread works on the inference too): the engine's own data-path work, preprocessing,
  hand-offs, decoding of outputs. The target is judged on (b);
- (c) the process's CPU (every thread: decode, ORT's pool, the rest);
and the processed fps over the window. The CPU inside `session.run` is bench-only
instrumentation: this process wraps `onnxruntime.InferenceSession.run` (and
`run_with_ort_values`, `run_with_iobinding`) with `time.thread_time()` before any model
loads; the wrapper costs both arms alike.

Saturation: 4 CenterFace cameras at 15 fps and 1 at 30 fps (640x480, CenterFace at
that size, batched across the 5 streams), each arm a fresh Runtime in this process.
The cameras are clock cameras (tests/support/clock_camera.py, live RTSP) where GStreamer's
RTSP server is installed, else the demo clip re-encoded at 640x480 and 15 / 30 fps
played as `pace: realtime` file sources (the results say which). After every stream's
first result and a warm-up, the processed fps summed over the streams in a window.

Per round, per model, the ratio new ÷ today of each figure; the verdicts take the
median of the rounds' ratios with its bootstrap 95 % interval:
- (b) drops by >= 30 %: met when the interval's upper bound is <= 0.70; (a) and (c)
  are reported beside it, not judged;
- saturation fps does not fall: met when the interval's lower bound is >= 0.97.

    python bench/data_path.py [--quick] [--rounds N]   # quick: 1 round, under 60 s
"""

from __future__ import annotations

import functools
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# Run as `python bench/data_path.py`: the repo root first on the path, for `bench` and `tests`.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import onnxruntime as ort

from appliance.runtime.runtime import Runtime
from bench._common import (
    ROOT,
    FirstResults,
    bench_parser,
    bench_providers,
    detect_streams_config,
    live_sources,
    report,
    traces_under,
)
from bench._compare import Verdict, judge, method, ratios, rotations

MODELS = ROOT / "configs" / "models"
CLIP = ROOT / "configs" / "media" / "demo.mp4"  # 960x540, 15 fps
ARMS = ("today", "new", "graph")
VARIANTS = ("new", "graph")  # each against today; `new` judged, `graph` reported
# What each arm sets on the model; `new` leaves both to their defaults (auto, true).
ARM_MODEL: dict[str, dict[str, Any]] = {
    "today": {"preprocess": "host", "batching": {"inline": False}},
    "new": {},
    # preprocess in the graph on the CPU too (`auto` keeps it on the host there); the
    # person detector (tf_od) has no prologue, so its `graph` arm is `new` again
    "graph": {"preprocess": "graph"},
}
MODEL_SPECS: dict[str, dict[str, Any]] = {
    "faces": {"path": str(MODELS / "centerface.onnx"), "decoder": "centerface"},
    "people": {
        "path": str(MODELS / "person_ssdlite.onnx"),
        "decoder": "tf_od",
        "labels": ["person"],
    },
}
CPU_TARGET = 0.70  # (b) new/today: a drop of at least 30 % (issue 31)
# Saturation fps new/today "does not fall": a bound of 1.0 would fail half the runs of
# two equal arms by chance; 0.97 lets the interval absorb the 2-core machine's
# round-to-round noise while a fall of more than 3 % still fails.
FPS_TARGET = 0.97
SATURATION = {15: 4, 30: 1}  # cameras per frame rate (fps -> count)
SIZE = (640, 480)  # the saturation cameras' frame size, as bench/freshness.py
FIRST_RESULT_TIMEOUT_S = 60.0
RUN_TIMEOUT_S = 300.0
RUN_METHODS = ("run", "run_with_ort_values", "run_with_iobinding")


class RunClock:
    """CPU seconds each thread has spent inside ONNX Runtime's run calls: bench-only
    instrumentation, installed on the class once, before any session is made."""

    def __init__(self) -> None:
        self._spent: dict[int, float] = {}  # thread ident -> s; each key written by its thread

    def install(self) -> None:
        for name in RUN_METHODS:
            original = getattr(ort.InferenceSession, name, None)
            if original is not None:
                setattr(ort.InferenceSession, name, self._timed(original))

    def _timed(self, original: Callable[..., Any]) -> Callable[..., Any]:
        spent = self._spent

        @functools.wraps(original)
        def timed(*args: Any, **kwargs: Any) -> Any:
            start = time.thread_time()
            try:
                return original(*args, **kwargs)
            finally:
                ident = threading.get_ident()
                spent[ident] = spent.get(ident, 0.0) + time.thread_time() - start

        return timed

    def spent(self, thread: threading.Thread | None) -> float:
        return 0.0 if thread is None or thread.ident is None else self._spent.get(thread.ident, 0.0)


def thread_cpu_s(thread: threading.Thread | None) -> float:
    """A live thread's CPU seconds (user + system); 0 for none (no batcher thread)."""
    if thread is None or thread.ident is None:
        return 0.0
    return time.clock_gettime(time.pthread_getcpuclockid(thread.ident))


@dataclass(frozen=True)
class Snapshot:
    at: float  # time.perf_counter()
    process_s: float
    worker_s: float
    batcher_s: float
    worker_run_s: float  # of worker_s, inside session.run
    batcher_run_s: float


class Window:
    """Subscribed to one stream: snapshots on its worker thread at the `skip`-th and the
    `skip + frames`-th result, i.e. at frame boundaries."""

    def __init__(self, clock: RunClock, stream: str, model: str, skip: int, frames: int):
        self._clock, self._names = clock, (f"work:{stream}", f"batch:{model}")
        self._marks = (skip, skip + frames)
        self._threads: dict[str, threading.Thread] = {}
        self._seen = 0
        self.snapshots: list[Snapshot] = []
        self.done = threading.Event()

    def __call__(self, _result: object) -> None:
        self._seen += 1
        if self._seen in self._marks:
            self.snapshots.append(self._snapshot())
            if len(self.snapshots) == len(self._marks):
                self.done.set()

    def _snapshot(self) -> Snapshot:
        if not self._threads:  # found once: names are unique in a one-stream runtime
            self._threads = {t.name: t for t in threading.enumerate() if t.name in self._names}
        work, batch = (self._threads.get(name) for name in self._names)
        return Snapshot(
            at=time.perf_counter(),
            process_s=time.process_time(),
            worker_s=thread_cpu_s(work),
            batcher_s=thread_cpu_s(batch),
            worker_run_s=self._clock.spent(work),
            batcher_run_s=self._clock.spent(batch),
        )


def per_frame(first: Snapshot, last: Snapshot, frames: int) -> dict[str, float]:
    """Milliseconds of CPU per frame over the window, and its fps."""

    def ms(field: str) -> float:
        return float(getattr(last, field) - getattr(first, field)) * 1000 / frames

    threads = ms("worker_s") + ms("batcher_s")
    inside = ms("worker_run_s") + ms("batcher_run_s")
    return {
        "a_ms": threads,
        "b_ms": threads - inside,
        "c_ms": ms("process_s"),
        "worker_ms": ms("worker_s"),
        "batcher_ms": ms("batcher_s"),
        "inside_run_ms": inside,
        "fps": frames / (last.at - first.at),
    }


def with_arm(model: dict[str, Any], arm: str) -> dict[str, Any]:
    """The model's spec with the arm's settings (batching merged, not replaced)."""
    setting = ARM_MODEL[arm]
    if arm == "graph" and model["decoder"] == "tf_od":
        setting = ARM_MODEL["new"]  # its input is uint8 already: no prologue to move
    batching = {**model.get("batching", {}), **setting.get("batching", {})}
    return {**model, **setting, "batching": batching}


def cpu_run(
    model: str, arm: str, clock: RunClock, skip: int, frames: int, work: Path
) -> dict[str, float]:
    """One fresh Runtime, one stream: CPU per frame over `frames` results after `skip`."""
    spec = with_arm({**MODEL_SPECS[model], "providers": bench_providers()}, arm)
    source = {"url": str(CLIP), "pace": "fast", "loop": True}
    config = traces_under(detect_streams_config(model, spec, {"s": source}), work)
    window = Window(clock, "s", model, skip, frames)
    runtime = Runtime(config)
    runtime.subscribe(window, "s")
    runtime.start()
    try:
        if not window.done.wait(RUN_TIMEOUT_S):
            raise SystemExit(f"{model}/{arm}: {frames + skip} results not reached")
    finally:
        runtime.stop()
    first, last = window.snapshots
    return per_frame(first, last, frames)


def saturation_run(
    arm: str, sources: dict[str, dict[str, Any]], timing: tuple[float, float], work: Path
) -> float:
    """One fresh Runtime over every saturation stream: processed fps summed over the
    streams in a window of timing[1] s, timing[0] s after every stream's first result."""
    warmup_s, seconds = timing
    model = {
        **MODEL_SPECS["faces"],
        "providers": bench_providers(),
        "input_size": list(SIZE),
        "labels": ["face"],
        # Several streams: batch across them like the shipped workflows (2 ms wait).
        "batching": {"max_batch_size": len(sources), "max_queue_delay_ms": 2},
    }
    config = traces_under(
        detect_streams_config("faces", with_arm(model, arm), sources, confidence=0.5), work
    )
    runtime, first = Runtime(config), FirstResults(list(sources))
    runtime.subscribe(first)
    runtime.start()
    try:
        if not first.all.wait(FIRST_RESULT_TIMEOUT_S):
            raise SystemExit(f"saturation/{arm}: not every stream produced a result")
        time.sleep(warmup_s)  # live sources: the window is wall time by design
        f0, t0 = processed(runtime, sources), time.perf_counter()
        time.sleep(seconds)
        f1, t1 = processed(runtime, sources), time.perf_counter()
    finally:
        runtime.stop()
    return (f1 - f0) / (t1 - t0)


def processed(runtime: Runtime, streams: dict[str, Any]) -> int:
    """Frames processed so far, summed over `streams` (the runtime's status reads)."""
    return sum(runtime.stream_status(sid).frames_processed for sid in streams)


@dataclass
class Results:
    """Every run's figures, per round."""

    cpu: dict[str, dict[str, list[dict[str, float]]]]  # model -> arm -> per round
    fps: dict[str, list[float]]  # arm -> saturation fps per round


def run_rounds(args: Any, work: Path) -> tuple[Results, str]:
    """Every round: per model both arms' CPU runs, then both arms' saturation runs, the
    arms in the round's rotated order; and what the saturation sources were."""
    clock = RunClock()
    clock.install()
    results = Results({m: {a: [] for a in ARMS} for m in MODEL_SPECS}, {a: [] for a in ARMS})
    with live_sources(SATURATION, SIZE, work) as (sources, kind):
        for r, order in enumerate(rotations(ARMS, args.rounds)):
            for model in MODEL_SPECS:
                for arm in order:
                    got = cpu_run(model, arm, clock, args.skip, args.frames, work)
                    results.cpu[model][arm].append(got)
                    print(f"round {r + 1} {model:>6} {arm:>5}: {describe(got)}", flush=True)
            for arm in order:
                fps = saturation_run(arm, sources, (args.warmup, args.seconds), work)
                results.fps[arm].append(fps)
                print(f"round {r + 1} saturation {arm:>5}: {fps:.1f} fps", flush=True)
    return results, kind


def describe(got: dict[str, float]) -> str:
    """One CPU run's figures on a line."""
    return (
        f"(a) {got['a_ms']:6.2f}  (b) {got['b_ms']:6.2f}  (c) {got['c_ms']:6.2f} ms/frame, "
        f"{got['fps']:5.1f} fps [worker {got['worker_ms']:.2f}, batcher {got['batcher_ms']:.2f}, "
        f"inside run {got['inside_run_ms']:.2f}]"
    )


FIGURES = {
    "a": "CPU per frame on the worker + batcher threads",
    "b": "CPU per frame on the worker + batcher threads outside session.run",
    "c": "the process's CPU per frame",
}
BREAKDOWN = ("worker_ms", "batcher_ms", "inside_run_ms")


def aggregate(results: Results) -> dict[str, Verdict]:
    """Each arm's figures (median, interval) and the ratios new ÷ today, judged: (b) per
    model and saturation fps against their targets, the rest reported only."""
    out: dict[str, Verdict] = {}
    for model, arms in results.cpu.items():
        for fig in (*FIGURES, "fps"):
            key = "fps" if fig == "fps" else f"{fig}_ms"
            for arm, rounds in arms.items():
                out[f"{model}.{arm}.{key}"] = judge([r[key] for r in rounds])
            for variant in VARIANTS:
                per_round = ratios([r[key] for r in arms[variant]], [r[key] for r in arms["today"]])
                judged = variant == "new" and fig == "b"
                name = f"{model}.{fig}_ratio" if variant == "new" else f"{model}.graph.{fig}_ratio"
                out[name] = judge(per_round, at_most=CPU_TARGET if judged else None)
    for arm, values in results.fps.items():
        out[f"saturation.{arm}.fps"] = judge(values)
    per_round = ratios(results.fps["new"], results.fps["today"])
    out["saturation.fps_ratio"] = judge(per_round, at_least=FPS_TARGET)
    out["saturation.graph.fps_ratio"] = judge(ratios(results.fps["graph"], results.fps["today"]))
    return out


def metrics_of(figures: dict[str, Verdict], results: Results) -> dict[str, Any]:
    """Medians with their intervals; each arm's breakdown (medians) beside them."""
    metrics: dict[str, Any] = {}
    for key, v in figures.items():
        metrics[key] = round(v.median, 3)
        metrics[f"{key}.interval"] = f"{v.low:.3f}-{v.high:.3f}"
    for model, arms in results.cpu.items():
        for arm, rounds in arms.items():
            for key in BREAKDOWN:
                metrics[f"{model}.{arm}.{key}"] = round(judge([r[key] for r in rounds]).median, 3)
    return metrics


def targets_and_met(figures: dict[str, Verdict]) -> tuple[dict[str, str], dict[str, bool]]:
    """Judged: (b) per model and saturation fps; the other ratios are reported beside."""
    targets, met = {}, {}
    for key, v in figures.items():
        if key.endswith("_ratio"):
            side = "lower" if v.at_least is not None else "upper"
            targets[key] = f"{v.target} ({side} bound)" if v.target else "reported, not judged"
            if v.target:
                met[key] = v.met
    return targets, met


def print_summary(figures: dict[str, Verdict]) -> None:
    """Per model and arm: (a), (b), (c) ms per frame and fps, medians [95 % interval];
    then the ratios new ÷ today; then saturation fps."""

    def cell(v: Verdict) -> str:
        mark = "" if not v.target else (" met" if v.met else " NOT")
        return f"{v.median:.3g} [{v.low:.3g}-{v.high:.3g}]{mark}"

    print(f"\n{'':<17}" + "".join(f"{c:>26}" for c in ("(a) ms", "(b) ms", "(c) ms", "fps")))
    for model in MODEL_SPECS:
        for arm in (*ARMS, "ratio", "graph ratio"):
            keys = [f"{model}.{arm}.{k}_ms" for k in FIGURES] + [f"{model}.{arm}.fps"]
            if arm == "ratio":
                keys = [f"{model}.{k}_ratio" for k in (*FIGURES, "fps")]
            if arm == "graph ratio":
                keys = [f"{model}.graph.{k}_ratio" for k in (*FIGURES, "fps")]
            cells = "".join(f"{cell(figures[k]):>26}" for k in keys)
            label = {"ratio": "new/today", "graph ratio": "graph/today"}.get(arm, arm)
            print(f"{model + ' ' + label:<17}{cells}")
    sat = [cell(figures[f"saturation.{k}"]) for k in ("today.fps", "new.fps", "fps_ratio")]
    print(f"saturation fps: today {sat[0]}, new {sat[1]}, new/today {sat[2]}")


def how(args: Any, kind: str) -> dict[str, Any]:
    """The results file's `method`."""
    return method(
        "CPU per frame on the worker and batcher threads, and processed fps at saturation: "
        "today (preprocess host, batching.inline false) against new (the defaults: inline "
        "runs; preprocess auto, the host on a CPU) and graph (preprocess graph, inline)",
        ARMS,
        args.rounds,
        f"per model (faces: CenterFace, people: the person detector), each arm a fresh "
        f"Runtime, one stream of {CLIP.name} (960x540, pace fast): snapshots on the worker "
        f"thread after {args.skip} results and {args.frames} results later; then saturation, "
        f"each arm a fresh Runtime over {sum(SATURATION.values())} streams, "
        f"{args.warmup:g} s after every stream's first result, a {args.seconds:g} s window",
        ratio="new ÷ and graph ÷ the same round's today, per figure",
        figures={**FIGURES, "fps": "processed fps over the same window"},
        thread_cpu="the thread's CPU clock (pthread_getcpuclockid: utime + stime in ns)",
        inside_run=(
            "time.thread_time() around InferenceSession.run, run_with_ort_values and "
            "run_with_iobinding, wrapped in the bench process only (bench instrumentation)"
        ),
        saturation_sources=kind,
        saturation=(
            f"{SATURATION[15]} CenterFace streams at 15 fps and {SATURATION[30]} at 30 fps, "
            f"{SIZE[0]}x{SIZE[1]}, batched across the streams (max_queue_delay_ms 2); "
            "processed fps summed over the streams (frames_processed deltas)"
        ),
        judged_on="(b) per model and saturation fps; (a), (c) reported beside them",
        providers=bench_providers(),
    )


def main() -> None:
    parser = bench_parser((__doc__ or "").splitlines()[0])
    parser.add_argument("--rounds", type=int, help="rounds (default 8; quick 1)")
    args = parser.parse_args()
    if args.rounds is not None and args.rounds < 1:
        parser.error(f"--rounds {args.rounds}: at least 1")
    quick = args.quick
    args.rounds = args.rounds or (1 if quick else 8)
    # Results skipped before the window (model warm-up, the first allocations), frames in it.
    args.skip, args.frames = (3, 10) if quick else (20, 150)
    args.warmup, args.seconds = (0.5, 2.0) if quick else (3.0, 10.0)
    work = ROOT / "bench" / ".work" / "data_path"
    work.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=work) as tmp:
        results, kind = run_rounds(args, Path(tmp))
    figures = aggregate(results)
    print_summary(figures)
    targets, met = targets_and_met(figures)
    verdicts = {key: v.as_json() for key, v in figures.items() if key.endswith("_ratio")}
    report(
        "data_path",
        metrics_of(figures, results),
        targets,
        met,
        method=how(args, kind),
        verdicts=verdicts,
    )


if __name__ == "__main__":
    main()
