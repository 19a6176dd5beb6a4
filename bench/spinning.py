"""ONNX Runtime's `allow_spinning` (the default, true) against false, on three live
workloads of this machine: what the README's config comment and docs/performance.md
("ONNX Runtime's threads spin again") say about it come from here.

Cameras: the bundled clip (configs/media/demo.mp4, 960x540, 15 fps) played `pace:
realtime`, looped, one decoder each, running the shipped workflows as they are
(batching 4, 2 ms; ORT's intra-op threads, one per core):

- `centerface4`: 4 cameras of privacy_blur.yaml (CenterFace): 60 frames/s offered, past
  what the cores run (saturated);
- `person8`: 8 cameras of people_counter.yaml (the person detector): 120 frames/s
  offered (saturated);
- `person1`: 1 camera of people_counter.yaml: 15 frames/s, below saturation.

Per workload, ONE runtime in this process: the arms are switched live with
`Runtime.retune(TuningConfig)` (what `appliance tune` does: the model's session opened
again with the other option and swapped in, no stream restarts), then `--settle` s,
then a window of `--window` s. Each round runs every arm once, the order rotated round
by round (bench/_compare.py `rotations`); per round the `allow_spinning: false` window's
figures are divided by the same round's `true` window's (`ratios`), median with a
bootstrap 95 % interval (`judge`, no target: the bench informs a default).

Per window: processed frames per second per stream (every result the outputs fan out),
and this process's CPU (user + system, every thread: decoders, models, workflows) over
the frames processed, ms per frame, and as cores busy. The CPU the rest of the machine
used meanwhile is kept too (`other_cores_busy`): other work on the cores is noise.

ORT's `session.force_spinning_stop` is not a third arm: the session config has no such
option (appliance/models/tuned.py ModelTuning, pipelines/spec.py SessionSpec).

    python bench/spinning.py [--quick] [--only person8] [--rounds N] [--window S]

`--quick`: 2 rounds of 1.5-s windows per workload, within 60 s, written to
bench/results/quick/spinning.json.
"""

from __future__ import annotations

import argparse
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
from _common import ROOT, bench_parser, proc_cpu_s, report
from _compare import judge, method, ratios, rotations

from appliance.config import TuningConfig, parse_config
from appliance.models.tuned import ModelTuning
from appliance.runtime.runtime import Runtime
from appliance.tune.meter import Meter

CLIP = ROOT / "configs" / "media" / "demo.mp4"
WORKFLOWS = ROOT / "configs" / "workflows"
ARMS = {"spinning": True, "not_spinning": False}  # arm -> allow_spinning
BASELINE, VARIANT = "spinning", "not_spinning"
FIGURES = ("fps_per_stream", "cpu_ms_per_frame", "cores_busy")


@dataclass(frozen=True)
class Workload:
    """Cameras of one shipped workflow, and the model whose spinning is switched."""

    workflow: str
    model: str
    cameras: int
    about: str


WORKLOADS = {
    "centerface4": Workload("privacy_blur.yaml", "faces", 4, "4 CenterFace cameras, saturated"),
    "person8": Workload("people_counter.yaml", "person", 8, "8 person-detector cameras, saturated"),
    "person1": Workload("people_counter.yaml", "person", 1, "1 person-detector camera, 15 fps"),
}


@dataclass(frozen=True)
class Sample:
    """One window's figures."""

    fps_per_stream: float
    cpu_ms_per_frame: float
    cores_busy: float
    other_cores_busy: float


def started(name: str, w: Workload, args: argparse.Namespace) -> Runtime:
    """The workload's runtime, started and warmed up."""
    source = {"url": str(CLIP), "loop": True, "pace": "realtime"}
    streams = [
        {"id": f"cam{i}", "source": source, "workflow": str(WORKFLOWS / w.workflow)}
        for i in range(w.cameras)
    ]
    doc = {
        "profiling": {"dir": str(Path(args.work) / name), "watch": {"enabled": False}},
        "streams": streams,
    }
    rt = Runtime(parse_config(doc, ROOT))
    rt.start()
    time.sleep(args.warmup)
    return rt


def switch(rt: Runtime, w: Workload, spinning: bool) -> None:
    """The model on `allow_spinning: spinning` from its next batch on (a no-op when it
    already is); checked, so an arm never measures the other's session."""
    rt.retune(TuningConfig(models={w.model: ModelTuning(allow_spinning=spinning)}))
    running = rt.pool.session_spec(w.model).allow_spinning
    if running is not spinning:
        raise RuntimeError(f"{w.model}: allow_spinning is {running} after a retune to {spinning}")


def measure(meter: Meter, streams: list[str], seconds: float) -> Sample:
    """One window: the results finished in it, and the CPU this process and the rest
    of the machine used meanwhile."""
    pid = os.getpid()
    machine0, cpu0, start = _machine_busy_s(), proc_cpu_s(pid), Meter.now()
    time.sleep(seconds)
    machine1, cpu1, end = _machine_busy_s(), proc_cpu_s(pid), Meter.now()
    window = meter.window(start, end, streams, 0.0)
    ours = cpu1 - cpu0
    wall = end - start
    return Sample(
        fps_per_stream=window.fps / len(streams),
        cpu_ms_per_frame=ours * 1000.0 / window.frames if window.frames else float("nan"),
        cores_busy=ours / wall,
        other_cores_busy=max(0.0, (machine1 - machine0) - ours) / wall,
    )


def _machine_busy_s() -> float:
    """CPU seconds every core has spent not idle since boot."""
    t = psutil.cpu_times()
    return float(sum(t) - t.idle - getattr(t, "iowait", 0.0))


def run_workload(name: str, w: Workload, args: argparse.Namespace) -> dict[str, list[Sample]]:
    """Rounds of every arm in rotating order on one runtime: each arm's windows."""
    rt = started(name, w, args)
    meter = Meter()
    unsubscribe = rt.outputs.subscribe(meter)
    streams = list(rt.streams)
    samples: dict[str, list[Sample]] = {arm: [] for arm in ARMS}
    print(f"\n[{name}] {w.about}: {args.rounds} rounds of {args.window:g} s", flush=True)
    try:
        for r, order in enumerate(rotations(list(ARMS), args.rounds)):
            for arm in order:
                switch(rt, w, ARMS[arm])
                time.sleep(args.settle)
                samples[arm].append(measure(meter, streams, args.window))
            print(f"  round {r + 1}: " + ", ".join(_shown(a, samples[a][-1]) for a in ARMS),
                  flush=True)  # fmt: skip
    finally:
        unsubscribe()
        rt.stop()
    return samples


def _shown(arm: str, s: Sample) -> str:
    return (f"{arm} {s.fps_per_stream:.2f} fps/stream {s.cpu_ms_per_frame:.1f} ms/frame "
            f"(others {s.other_cores_busy:.2f} cores)")  # fmt: skip


def summary(samples: dict[str, list[Sample]]) -> tuple[dict[str, Any], dict[str, Any]]:
    """A workload's metrics (per arm: each figure's median and interval; the per-round
    ratios off/on) and its verdicts (the ratios, no target)."""
    metrics: dict[str, Any] = {}
    for arm in ARMS:
        metrics[arm] = {f: _interval([getattr(s, f) for s in samples[arm]]) for f in FIGURES}
    verdicts: dict[str, Any] = {}
    for figure, key in (("fps_per_stream", "fps"), ("cpu_ms_per_frame", "cpu")):
        on = [getattr(s, figure) for s in samples[BASELINE]]
        off = [getattr(s, figure) for s in samples[VARIANT]]
        verdict = judge(ratios(off, on))
        metrics[f"{key}_ratio_off_vs_on"] = _rounded(verdict.median, verdict.low, verdict.high, 4)
        verdicts[f"{key}_ratio_off_vs_on"] = verdict.as_json()
    everyone = [s.other_cores_busy for arm in ARMS for s in samples[arm]]
    metrics["other_cores_busy"] = _interval(everyone)
    return metrics, verdicts


def _interval(values: list[float]) -> dict[str, float]:
    v = judge(values)
    return _rounded(v.median, v.low, v.high, 3)


def _rounded(median: float, low: float, high: float, digits: int) -> dict[str, float]:
    return {"median": round(median, digits), "low": round(low, digits),
            "high": round(high, digits)}  # fmt: skip


def main() -> None:
    parser = bench_parser(__doc__ or "")
    parser.add_argument("--only", choices=list(WORKLOADS), action="append")
    parser.add_argument("--rounds", type=int, default=12, help="rounds of every arm")
    parser.add_argument("--window", type=float, default=5.0, help="seconds measured per arm")
    parser.add_argument("--settle", type=float, default=2.0, help="seconds after a switch")
    parser.add_argument("--warmup", type=float, default=8.0, help="seconds after the start")
    parser.add_argument("--work", default=str(ROOT / "bench" / ".work" / "spinning"))
    args = parser.parse_args()
    if args.quick:
        args.rounds, args.window, args.settle, args.warmup = 2, 1.5, 0.5, 3.0
    t0 = time.monotonic()
    names = args.only or list(WORKLOADS)
    metrics: dict[str, Any] = {}
    verdicts: dict[str, Any] = {}
    load: dict[str, Any] = {}
    for name in names:
        before = os.getloadavg()[0]
        metrics[name], found = summary(run_workload(name, WORKLOADS[name], args))
        verdicts.update({f"{name}.{key}": v for key, v in found.items()})
        load[name] = {"before": round(before, 2), "after": round(os.getloadavg()[0], 2)}
    elapsed = time.monotonic() - t0
    how = method(
        "ONNX Runtime's allow_spinning true (ORT's default) against false, switched live "
        "on one runtime per workload (Runtime.retune); no target: the bench informs a "
        "default, the verdicts report the ratios off/on",
        list(ARMS), args.rounds,
        f"each arm once: retune, {args.settle:g} s settle, a {args.window:g}-s window",
        baseline=BASELINE,
        workloads={n: WORKLOADS[n].about for n in names},
        cameras="configs/media/demo.mp4 (960x540, 15 fps), pace: realtime, looped",
        cpu="this process's user + system CPU over the window, per frame processed",
        warmup_s=args.warmup,
    )  # fmt: skip
    report("spinning", metrics, {}, {}, method=how, verdicts=verdicts,
           load_1min=load, elapsed_s=round(elapsed, 1))  # fmt: skip
    print_summary(metrics)
    print(f"elapsed {elapsed:.0f} s")


def print_summary(metrics: dict[str, Any]) -> None:
    """Each workload's arms and ratios, one line each: median [interval]."""

    def cell(v: dict[str, float]) -> str:
        return f"{v['median']:.3g} [{v['low']:.3g}-{v['high']:.3g}]"

    for name, m in metrics.items():
        print(f"\n{name} (other processes: {cell(m['other_cores_busy'])} cores)")
        for arm in ARMS:
            figures = "  ".join(f"{f} {cell(m[arm][f])}" for f in FIGURES)
            print(f"  {arm:<13} {figures}")
        print(f"  off/on        fps {cell(m['fps_ratio_off_vs_on'])}  "
              f"cpu_ms_per_frame {cell(m['cpu_ratio_off_vs_on'])}")  # fmt: skip


if __name__ == "__main__":
    main()
