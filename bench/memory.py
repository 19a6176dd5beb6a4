"""Memory per stream: what one more camera costs in RSS, and where it goes.

Each of the demo's workflows (`people`: the people counter, `faces`: the privacy blur,
with their real models; `bare`: no block, the decoded frame alone) on N streams of the
demo clip played as live cameras (960x540, 15 fps, `pace: realtime`), N = 1, 3, 5, 7, 9.
Each run is a fresh child process (this file with `--child`): the appliance's Runtime
over the config, as `appliance serve` runs it without the HTTP server (whose memory does
not grow with the streams); after SECONDS it reads its RSS and /proc/self/smaps_rollup.
Per round, the memory per extra stream is the least-squares slope of RSS over N; the
figure is the median of the rounds' slopes with its bootstrap 95 % interval
(bench/_compare.py), met when the interval's upper bound is under the target: 20 MB a
people-counter stream, 40 MB a privacy-blur stream. The counts run in a rotated order
each round, so the machine's spells do not line up with N.

Variants (`--variants`, each count of each in the same rotated rounds): `default`;
`no_arena`, the workflows' models set to `session.memory_arena: false` (ONNX Runtime's
arena, which keeps the largest batch's buffers); `mmap`, the child run with glibc's
`MALLOC_MMAP_THRESHOLD_=131072` (every allocation over 128 KiB, a frame or a tensor, is
its own mapping, given back to the system when freed; by default glibc raises that
threshold to the largest block freed so far, up to 32 MiB, and frame-sized blocks are
then kept in each thread's heap); `arenas2`, with `MALLOC_ARENA_MAX=2` (glibc's per-thread
heaps capped at two; its default is 8 per core). The difference of a variant's slope from
the default's is what it saves per stream; the frames each child processed in its window
(at the largest count) say what it costs in throughput.

Where it goes: one more run at the smallest and the largest N with tracemalloc on (the
Python heap and numpy's arrays, by the file that allocated them, grouped by module) and
ONNX Runtime's arena per model read from the process's allocations outside them: per
extra stream, each group's growth over the counts' difference. tracemalloc slows the
process, so these runs are not the slope's.

    python bench/memory.py [--quick] [--rounds R] [--counts 1,3,5,7,9] [--seconds S]
        [--workflows people,faces,bare] [--variants default,...] [--keep]
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import numpy as np
import yaml

from bench._common import ROOT, bench_parser, kept, report
from bench._compare import Verdict, judge, method, rotations

WORKFLOWS = {"people": "people_counter.yaml", "faces": "privacy_blur.yaml", "bare": ""}
# `bare`: no block, the frame itself as the output: what the source, its decoder and the
# stream's threads hold without a workflow (reported beside the others, not judged).
BARE = {"name": "bare", "blocks": [], "outputs": {"video": "frame"}}
TARGET_MB: dict[str, float | None] = {"people": 20.0, "faces": 40.0, "bare": None}
SMAPS = ("Rss", "Anonymous", "Private_Dirty", "Shared_Clean", "Private_Clean")
TOP_GROUPS = 12


# -- the child --------------------------------------------------------------------------
def child(config: Path, seconds: float, trace: bool) -> dict[str, Any]:
    """Run the appliance on `config` for `seconds`; its memory then."""
    if trace:
        import tracemalloc

        tracemalloc.start(1)
    import psutil

    from appliance.config import load_config
    from appliance.runtime.runtime import Runtime

    runtime = Runtime(load_config(config))
    runtime.start()
    try:
        time.sleep(seconds)
        got: dict[str, Any] = {"rss_mb": psutil.Process().memory_info().rss / 2**20}
        got["smaps_mb"] = smaps_rollup()
        got["processed"] = sum(s.rate.count for s in runtime.streams.values())
        if trace:
            got["python_mb"] = python_heap()
    finally:
        runtime.stop()
    return got


def smaps_rollup() -> dict[str, float]:
    out: dict[str, float] = {}
    for line in Path("/proc/self/smaps_rollup").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in SMAPS:
            out[key] = int(value.split()[0]) / 1024  # kB -> MB
    return out


def python_heap() -> dict[str, float]:
    """tracemalloc's live bytes by allocating module: `appliance/<pkg>`, `pipelines/
    <pkg>`, `sinks`, or the library's top folder."""
    import tracemalloc

    groups: dict[str, float] = {}
    for stat in tracemalloc.take_snapshot().statistics("filename"):
        name = module_group(stat.traceback[0].filename)
        groups[name] = groups.get(name, 0.0) + stat.size / 2**20
    return groups


def module_group(filename: str) -> str:
    path = Path(filename)
    try:
        parts = path.resolve().relative_to(ROOT).parts
    except ValueError:
        parts = path.parts
        if "site-packages" in parts:
            return parts[parts.index("site-packages") + 1].split(".")[0]
        return f"python:{path.stem}" if "python3" in filename else path.name
    if parts[0] in ("appliance", "pipelines") and len(parts) > 2:
        return "/".join(parts[:2])
    return "/".join(parts[:2]) if len(parts) > 1 else parts[0]


# -- the bench --------------------------------------------------------------------------
def write_config(folder: Path, workflow: str, streams: int, variant: str = "") -> Path:
    arena = variant != "no_arena"
    for name in ("models", "media"):
        link = folder / name
        if not link.exists():
            link.symlink_to(ROOT / "configs" / name)
    wf_dir = folder / "workflows"
    wf_dir.mkdir(exist_ok=True)
    spec: dict[str, Any] = {**BARE, "models": {}}
    if WORKFLOWS[workflow]:
        spec = yaml.safe_load((ROOT / "configs" / "workflows" / WORKFLOWS[workflow]).read_text())
    for model in spec["models"].values():
        model.setdefault("session", {})["memory_arena"] = arena
    wf_name = f"{'' if arena else 'no-arena-'}{WORKFLOWS[workflow] or 'bare.yaml'}"
    (wf_dir / wf_name).write_text(yaml.safe_dump(spec))
    doc = {
        "profiling": {"dir": "traces"},
        "streams": [
            {"id": f"cam{i}", "source": {"url": "media/demo.mp4", "loop": True, "pace": "realtime"},
             "workflow": f"workflows/{wf_name}"}
            for i in range(streams)
        ],
    }  # fmt: skip
    path = folder / f"{workflow}-{streams}{'' if arena else '-no-arena'}.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def run(
    folder: Path, workflow: str, streams: int, seconds: float, trace: bool, variant: str = ""
) -> dict[str, Any]:
    config = write_config(folder, workflow, streams, variant)
    argv = [sys.executable, __file__, "--child", str(config),
            "--seconds", str(seconds)] + (["--trace"] if trace else [])  # fmt: skip
    env = {**os.environ, **VARIANT_ENV.get(variant, {})}
    done = subprocess.run(
        argv, check=False, capture_output=True, text=True, timeout=seconds + 120, env=env
    )
    if done.returncode != 0:
        raise RuntimeError(f"memory child failed: {done.stderr[-1500:]}")
    got: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return got


def slope(counts: list[int], values: list[float]) -> float:
    return float(np.polyfit(counts, values, 1)[0])


def growth(low: dict[str, Any], high: dict[str, Any], extra: int) -> dict[str, float]:
    """Per extra stream: each Python group's growth, the smaps figures' and the rest."""
    lo, hi = low["python_mb"], high["python_mb"]
    per = {k: (hi.get(k, 0.0) - lo.get(k, 0.0)) / extra for k in set(lo) | set(hi)}
    top = dict(sorted(per.items(), key=lambda kv: -abs(kv[1]))[:TOP_GROUPS])
    python = (sum(hi.values()) - sum(lo.values())) / extra
    anon = (high["smaps_mb"]["Anonymous"] - low["smaps_mb"]["Anonymous"]) / extra
    return {
        **{f"python:{k}": round(v, 2) for k, v in top.items()},
        "python_total": round(python, 2),
        "anonymous_total": round(anon, 2),
        "native_outside_python": round(anon - python, 2),
        "rss_total": round((high["rss_mb"] - low["rss_mb"]) / extra, 2),
    }


Rss = dict[str, dict[int, list[float]]]  # key -> stream count -> a figure per round
VARIANT_ENV = {
    "mmap": {"MALLOC_MMAP_THRESHOLD_": "131072"},
    "arenas2": {"MALLOC_ARENA_MAX": "2"},
}
VARIANTS = ("default", "no_arena", *VARIANT_ENV)


def key(workflow: str, variant: str) -> str:
    """`people`, or `people.no_arena` for a variant's runs."""
    return f"{workflow}.{variant}" if variant else workflow


def measure(
    folder: Path,
    workflows: list[str],
    counts: list[int],
    rounds: int,
    seconds: float,
    variants: tuple[str, ...] = ("",),
) -> tuple[Rss, Rss]:
    """RSS MB and frames processed, per workflow (and variant), count and round."""
    keys = [key(w, v) for w in workflows for v in variants]
    rss: Rss = {k: {n: [] for n in counts} for k in keys}
    frames: Rss = {k: {n: [] for n in counts} for k in keys}
    arms = [f"{n}{v and ':' + v}" for n in counts for v in variants]
    for r, order in enumerate(rotations(arms, rounds)):
        for workflow in workflows:
            for arm in order:
                n, _, variant = arm.partition(":")
                k = key(workflow, variant)
                got = run(folder, workflow, int(n), seconds, False, variant)
                rss[k][int(n)].append(got["rss_mb"])
                frames[k][int(n)].append(got["processed"])
                print(f"round {r + 1}/{rounds} {k} x{n}: {got['rss_mb']:.0f} MB RSS, "
                      f"{got['processed']} frames", flush=True)  # fmt: skip
    return rss, frames


def figures(
    rss: Rss, frames: Rss, counts: list[int], rounds: int
) -> tuple[dict[str, Any], dict[str, Verdict]]:
    metrics: dict[str, Any] = {}
    verdicts: dict[str, Verdict] = {}
    for k, by_n in rss.items():
        slopes = [slope(counts, [by_n[n][r] for n in counts]) for r in range(rounds)]
        target = TARGET_MB[k.split(".")[0]]
        verdict = judge(slopes, at_most=target)
        if target is not None:
            verdicts[f"{k}.mb_per_stream"] = verdict
        metrics[f"{k}.mb_per_stream"] = round(verdict.median, 1)
        metrics[f"{k}.mb_per_stream.interval"] = f"{verdict.low:.1f}-{verdict.high:.1f}"
        for n in counts:
            metrics[f"{k}.n{n}.rss_mb"] = round(statistics.median(by_n[n]), 1)
            metrics[f"{k}.n{n}.frames"] = round(statistics.median(frames[k][n]))
    for k in [k for k in rss if "." in k]:
        base = k.split(".")[0]
        # What the variant saves per extra stream, and its frames (at the largest count).
        metrics[f"{k}.saved_mb_per_stream"] = round(
            metrics[f"{base}.mb_per_stream"] - metrics[f"{k}.mb_per_stream"], 1
        )
        n = counts[-1]
        ratios = [a / b for a, b in zip(frames[k][n], frames[base][n], strict=True) if b]
        if ratios:
            metrics[f"{k}.frames_ratio"] = round(statistics.median(ratios), 3)
    return metrics, verdicts


def main() -> None:
    parser = bench_parser(__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--counts", default="1,3,5,7,9")
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--workflows", default="people,faces")
    parser.add_argument("--variants", default=",".join(VARIANTS), help=f"of {VARIANTS}")
    parser.add_argument(
        "--keep",
        action="store_true",
        help="keep the results file's figures of workflows this run leaves out",
    )
    parser.add_argument("--child", type=Path, help=argparse_hidden())
    parser.add_argument("--trace", action="store_true", help=argparse_hidden())
    args = parser.parse_args()
    if args.child is not None:
        print(json.dumps(child(args.child, args.seconds, args.trace)), flush=True)
        return
    quick = args.quick
    counts = [1, 3] if quick else [int(c) for c in args.counts.split(",")]
    workflows = ["people"] if quick else args.workflows.split(",")
    rounds, seconds = (1, 8.0) if quick else (args.rounds, args.seconds)
    with tempfile.TemporaryDirectory(prefix="bench-memory-") as tmp:
        folder = Path(tmp)
        asked = ["default"] if quick else args.variants.split(",")
        if unknown := set(asked) - set(VARIANTS):
            parser.error(f"--variants: unknown {sorted(unknown)}; known: {VARIANTS}")
        variants = tuple("" if v == "default" else v for v in asked)
        rss, frames = measure(folder, workflows, counts, rounds, seconds, variants)
        metrics, verdicts = figures(rss, frames, counts, rounds)
        for workflow in workflows:
            low, high = (
                run(folder, workflow, n, seconds, trace=True) for n in (counts[0], counts[-1])
            )
            for key, value in growth(low, high, counts[-1] - counts[0]).items():
                metrics[f"{workflow}.per_stream.{key}"] = value
    targets = {
        k: f"<= {TARGET_MB[k.split('.')[0]]:g} MB (95 % interval's upper bound)" for k in verdicts
    }
    how = method(
        "RSS per extra stream of the demo's workflows (real models), live-paced demo clip",
        [f"{n}{v and ' ' + v}" for n in counts for v in variants], rounds,
        f"a fresh child per count: the Runtime for {seconds:g} s, then its RSS",
        figure="median of the rounds' least-squares slopes of RSS over the stream count",
    )  # fmt: skip
    met = {k: v.met for k, v in verdicts.items()}
    verdict_json = {k: v.as_json() for k, v in verdicts.items()}
    old: dict[str, Any] = {}
    if args.keep:  # the other workflows' figures, from the file this run replaces
        old = kept("memory", lambda k: fresh(k, workflows, variants))
        metrics = old.get("metrics", {}) | metrics
        targets, met = old.get("targets", {}) | targets, old.get("met", {}) | met
        verdict_json = old.get("verdicts", {}) | verdict_json
    extra = {"kept_from": old.get("run")} if args.keep else {}
    report("memory", metrics, targets, met, method=how, verdicts=verdict_json, **extra)


def fresh(key: str, workflows: list[str], variants: tuple[str, ...]) -> bool:
    """Whether this run measures the results key anew: its workflow ran, and so did its
    variant (`people.no_arena.…`), the default's keys having none (`people.n1.…`)."""
    workflow, _, rest = key.partition(".")
    variant = rest.split(".")[0]
    return workflow in workflows and (variant not in VARIANTS or variant in variants)


def argparse_hidden() -> str:
    import argparse

    return argparse.SUPPRESS


if __name__ == "__main__":
    main()
