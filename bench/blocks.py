"""Blocks: the per-frame cost of each block, as docs/workflows.md states it.

    python bench/blocks.py [--quick]

Each case runs one block's compiled step (the callable the executor calls per frame,
compiled by pipelines/ from a two-block workflow) on frames of configs/media/demo.mp4
(960x540) with synthetic detections where the page says "20 boxes", in the frame size,
box counts and options the page names (bench/_block_cases.py); the model cases run the
bundled PP-OCRv4 models and a tiny classifier (bench/_block_models.py). The executor's
own cost per frame is bench/engine_overhead.py's.

Method (bench/_compare.py): every case runs in every round, the order rotating each
round, so the machine's slow and fast spells spread over all of them. In a round a case
times `reps` calls one by one with time.perf_counter_ns (sub-µs work: loops of calls) and
keeps their median; a figure is the median of those per-round medians, with a bootstrap
95 % interval. One target, the page's own bound: `rate_limit` under 1 µs per frame, met
only by the interval's upper bound.

--quick (20 s on 2 busy cores): 6 rounds, a quarter of the calls per round; full (4 min
on 2 busy cores): 40 rounds.
"""

from __future__ import annotations

import gc
import tempfile
import time
from collections.abc import Callable
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import numpy as np
from _block_cases import Case, cases
from _block_data import demo_frames
from _block_models import classify, ocr
from _common import parse_args, report
from _compare import alternate, judge, method

FULL_ROUNDS, QUICK_ROUNDS = 40, 6
QUICK_SHARE = 4  # a quick round times a quarter of a full round's calls
WARM_CALLS = 20  # untimed calls per case before the rounds, at most
DEMO_FRAMES = 30
RATE_LIMIT_BOUND_US = 1.0  # the page: "under 1 µs per frame"


def sampler(case: Case, reps: int) -> Callable[[], float]:
    """One round of a case: the median per-call time of `reps` timed samples, in the
    case's unit. Frames follow on from the last round (a tracker's sequence goes on)."""
    position = 0

    def one_round() -> float:
        nonlocal position
        if case.reset is not None:
            case.reset()
            position = 0
        call, batch, times = case.call, case.batch, []
        gc.disable()  # collections run between rounds, not inside a timed call
        try:
            for _ in range(reps):
                start = time.perf_counter_ns()
                for i in range(position, position + batch):
                    call(i)
                times.append((time.perf_counter_ns() - start) / batch)
                position += batch
        finally:
            gc.enable()
        return float(np.median(times)) * case.per_ns

    return one_round


def warm(case: Case) -> None:
    """Untimed calls first: caches, ONNX Runtime's first runs, a tracker's first tracks
    (up to WARM_CALLS; half a round of a model's few calls)."""
    for i in range(max(1, min(WARM_CALLS, case.reps // 2))):
        case.call(i)
    if case.reset is not None:
        case.reset()


def figures(key: str, values: list[float]) -> dict[str, float]:
    """`key_p50`, `key_lo`, `key_hi`: the median of the rounds and its interval."""
    verdict = judge(values)
    digits = 3 if key.endswith("_us") else 5
    return {
        f"{key}_p50": round(verdict.median, digits),
        f"{key}_lo": round(verdict.low, digits),
        f"{key}_hi": round(verdict.high, digits),
    }


def main() -> None:
    args = parse_args(__doc__.splitlines()[0])
    rounds = QUICK_ROUNDS if args.quick else FULL_ROUNDS
    started = time.monotonic()
    with ExitStack() as stack, tempfile.TemporaryDirectory() as tmp:
        images = demo_frames(DEMO_FRAMES)
        model_cases, checks = ocr(images, stack)
        every = [*cases(images), *classify(images, Path(tmp), stack), *model_cases]
        reps = {c.key: max(1, c.reps // QUICK_SHARE) if args.quick else c.reps for c in every}
        for case in every:
            warm(case)
        print(f"{len(every)} cases, {rounds} rounds (set-up {time.monotonic() - started:.0f} s)")

        def progress(r: int, values: dict[str, list[float]]) -> None:
            gc.collect()
            print(f"round {r + 1}/{rounds}: {time.monotonic() - started:.0f} s", flush=True)

        arms = {c.key: sampler(c, reps[c.key]) for c in every}
        values = alternate(arms, rounds, progress)
    metrics: dict[str, Any] = {}
    for key, per_round in values.items():
        metrics.update(figures(key, per_round))
    metrics.update(checks)
    bound = judge(values["rate_limit_every_s_us"], at_most=RATE_LIMIT_BOUND_US)
    target_key = "rate_limit_every_s_us_p50"
    report(
        "blocks",
        metrics,
        {target_key: f"<= {RATE_LIMIT_BOUND_US:g} (the interval's upper bound)"},
        {target_key: bound.met},
        method=method(
            "per-frame cost of each block's compiled step, docs/workflows.md's cases",
            list(arms),
            rounds,
            "every case once, in rotating order: `reps` calls each, timed one by one "
            "(perf_counter_ns; loops of `batch` calls for sub-µs work), their median",
            figure="median of the per-round medians; _lo/_hi: its interval",
            reps=reps,
            batch={c.key: c.batch for c in every if c.batch > 1},
            frames="configs/media/demo.mp4, 960x540; OCR frames with two text lines drawn",
            seconds=round(time.monotonic() - started),
        ),
        verdicts={target_key: bound.as_json()},
    )


if __name__ == "__main__":
    main()
