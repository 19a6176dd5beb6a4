"""The tracker against its own code at an earlier revision: the cost of `ByteTracker.update`
per frame, both versions alternating in one process, and their outputs compared.

The earlier version is the tracker package (pipelines/tracking/) as `git show REV` gives
it, written beside this run as a package of its own (`base_tracking`), its imports of
itself pointed there; both versions take the same Detections. Scenes, generated with a
fixed seed: `few`, three people standing apart (the ceiling bench's near-free model:
bench/_free_models.py), and `crowd`, 20 people walking across a 1280x720 frame with the
detector's jitter and scores spread over the low and high thresholds, some boxes missed
(bench/blocks.py's 20-box case, as moving people). Each round runs each arm on a fresh
tracker over the scene's frames, the order rotated each round (bench/_compare.py); per
round the ratio current ÷ base of the µs per frame; the figure is the median with its
bootstrap 95 % interval. Every frame's output (boxes, scores, track ids) must be the
same in both arms, or the bench stops: the cut changes no result.

    python bench/tracker.py [--quick] [--base REV]   # quick: 4 rounds of 200 frames
"""

from __future__ import annotations

import importlib
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import numpy as np

from bench._common import ROOT, bench_parser, report
from bench._compare import judge, method, ratios, rotations
from pipelines.tracking.bytetrack import ByteTracker
from pipelines.types import Detections

BASE_REV = "a5f6109"  # the tracker before issue 42's cuts
MODULES = ("__init__", "assignment", "boxes", "bytetrack", "kalman")
ARMS = ("base", "current")
SCENES = ("few", "crowd")


def base_tracker(rev: str, folder: Path) -> type[ByteTracker]:
    """The ByteTracker class of pipelines/tracking/ at `rev`, importable from `folder`."""
    package = folder / "base_tracking"
    package.mkdir()
    for name in MODULES:
        text = subprocess.run(
            ["git", "show", f"{rev}:pipelines/tracking/{name}.py"],
            cwd=ROOT, check=True, capture_output=True, text=True,
        ).stdout  # fmt: skip
        text = text.replace("from pipelines.tracking.", "from base_tracking.")
        text = text.replace("from pipelines.tracking import", "from base_tracking import")
        (package / f"{name}.py").write_text(text)
    sys.path.insert(0, str(folder))
    module = importlib.import_module("base_tracking.bytetrack")
    cls: type[ByteTracker] = module.ByteTracker
    return cls


def scene(name: str, frames: int) -> list[Detections]:
    rng = np.random.default_rng(7)
    if name == "few":  # three people standing, the same boxes every frame
        boxes = np.array([[64, 96, 160, 384], [256, 120, 352, 432], [448, 72, 544, 336]])
        dets = Detections.from_arrays(boxes.astype(np.float32), [0.9] * 3, [0] * 3)
        return [dets] * frames
    start = rng.uniform([0, 100], [1200, 500], (20, 2))
    step = rng.normal(0, 4, (20, 2))  # px per frame
    out = []
    for f in range(frames):
        seen = rng.random(20) > 0.05  # the detector misses one box in twenty
        xy = (start + f * step)[seen] + rng.normal(0, 2, (int(seen.sum()), 2))
        xyxy = np.concatenate([xy, xy + np.array([50.0, 140.0])], axis=1).astype(np.float32)
        scores = rng.uniform(0.2, 0.95, len(xy)).astype(np.float32)
        out.append(Detections.from_arrays(xyxy, scores, np.zeros(len(xy), np.int64)))
    return out


def run(make: Callable[[], Any], frames: list[Detections]) -> tuple[float, list[Detections]]:
    """µs per frame of one fresh tracker over the frames, and its outputs."""
    tracker = make()
    start = time.perf_counter()
    outputs = [tracker.update(d) for d in frames]
    return (time.perf_counter() - start) / len(frames) * 1e6, outputs


def same(a: list[Detections], b: list[Detections]) -> bool:
    return all(
        np.array_equal(x.xyxy, y.xyxy)
        and np.array_equal(x.confidence, y.confidence)
        and np.array_equal(x.tracker_id, y.tracker_id)
        for x, y in zip(a, b, strict=True)
    )


def main() -> None:
    parser = bench_parser(__doc__.splitlines()[0])
    parser.add_argument("--base", default=BASE_REV, help="the revision to compare with")
    args = parser.parse_args()
    rounds, frames = (4, 200) if args.quick else (20, 600)
    with tempfile.TemporaryDirectory(prefix="bench-tracker-") as tmp:
        makers: dict[str, Callable[[], Any]] = {
            "base": base_tracker(args.base, Path(tmp)),
            "current": ByteTracker,
        }
        us: dict[str, dict[str, list[float]]] = {s: {a: [] for a in ARMS} for s in SCENES}
        for name in SCENES:
            frames_of = scene(name, frames)
            for r, order in enumerate(rotations(ARMS, rounds)):
                got = {arm: run(makers[arm], frames_of) for arm in order}
                if not same(got["base"][1], got["current"][1]):
                    raise SystemExit(f"{name}: the two trackers' outputs differ")
                for arm in ARMS:
                    us[name][arm].append(got[arm][0])
                print(f"round {r + 1}/{rounds} {name}: base {got['base'][0]:.1f} µs, "
                      f"current {got['current'][0]:.1f} µs a frame", flush=True)  # fmt: skip
    metrics: dict[str, Any] = {"base": args.base, "frames": frames, "rounds": rounds}
    for name in SCENES:
        verdict = judge(ratios(us[name]["current"], us[name]["base"]))
        metrics[f"{name}.ratio"] = round(verdict.median, 3)
        metrics[f"{name}.ratio.interval"] = f"{verdict.low:.3f}-{verdict.high:.3f}"
        for arm in ARMS:
            metrics[f"{name}.{arm}_us"] = round(float(np.median(us[name][arm])), 1)
    how = method(
        "ByteTracker.update, this code against pipelines/tracking/ at --base, same frames",
        list(ARMS), rounds, f"each arm a fresh tracker over {frames} frames, outputs compared",
        ratio="current ÷ base µs per frame, per round",
    )  # fmt: skip
    report("tracker", metrics, {}, {}, method=how)


if __name__ == "__main__":
    main()
