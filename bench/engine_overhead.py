"""Engine overhead: compile time and per-frame executor cost of a 10-block workflow.

- compile: `compile_workflow` of a 10-block chain of trivial blocks, no models (median of
  many compilations after a warm-up). Target ≤ 2 ms (Roboflow quotes 10–25 ms).
- overhead: the executor running 10 no-op blocks, against calling the same 10 no-op
  functions directly in a loop: the difference per frame is all the engine's (argument
  gathering, timing each block, storing outputs, the result). Rounds alternate the two;
  the median and the min–max over rounds are reported. Target ≤ 50 µs per frame
  (Roboflow: 1–2 ms).
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np
from _common import parse_args, report

from pipelines.blocks.base import BlockParams, BlockType, BuildContext, StepFactory, stateless
from pipelines.compiler import compile_workflow
from pipelines.registry import BlockRegistry
from pipelines.types import Frame

BLOCKS = 10


class ScaleParams(BlockParams):
    factor: float = 1.0
    label: str = ""


class Passthrough(BlockType):
    """A trivial block: hands its image on (an attribute read and a call)."""

    type_name = "passthrough"
    Params = ScaleParams
    inputs = {"image": ("image", "frame")}
    outputs = {"image": "image"}

    @classmethod
    def build(cls, params: Any, ctx: BuildContext) -> StepFactory:
        return stateless(lambda image: image)


REGISTRY = BlockRegistry({"passthrough": f"{__name__}:Passthrough"})


def workflow() -> dict[str, Any]:
    blocks = [{"id": "b0", "type": "passthrough", "factor": 1.5, "label": "first"}]
    for i in range(1, BLOCKS):
        blocks.append({"id": f"b{i}", "type": "passthrough", "image": f"b{i - 1}", "factor": i})
    return {"name": "ten", "blocks": blocks, "outputs": {"video": f"b{BLOCKS - 1}"}}


def compile_ms(runs: int) -> float:
    doc, ctx = workflow(), BuildContext(models={})
    for _ in range(20):
        compile_workflow(doc, ctx, REGISTRY)  # warm-up: imports, pydantic caches
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        compile_workflow(doc, ctx, REGISTRY)
        times.append(time.perf_counter() - t0)
    return float(np.median(times)) * 1000


def _noop(image: Any) -> Any:
    return image


def overhead_us(frames: int, rounds: int) -> tuple[list[float], float, float]:
    """Per round, executor minus direct calls per frame (µs); and the medians of the
    executor's and the direct chain's time per frame (µs)."""
    run = compile_workflow(workflow(), BuildContext(models={}), REGISTRY).instantiate().run
    image = np.zeros((540, 960, 3), np.uint8)
    frame = Frame("bench", 0, None, time.time(), time.perf_counter(), image)
    chain = [_noop] * BLOCKS  # the blocks' own work, called with nothing around it

    def executor() -> float:
        t0 = time.perf_counter()
        for _ in range(frames):
            run(frame)
        return (time.perf_counter() - t0) / frames * 1e6

    def direct() -> float:
        t0 = time.perf_counter()
        for _ in range(frames):
            value = frame.image
            for step in chain:
                value = step(value)
        return (time.perf_counter() - t0) / frames * 1e6

    diffs, engine, bare = [], [], []
    for r in range(rounds):
        pair = (executor, direct) if r % 2 == 0 else (direct, executor)
        first, second = pair[0](), pair[1]()
        e, d = (first, second) if r % 2 == 0 else (second, first)
        engine.append(e)
        bare.append(d)
        diffs.append(e - d)
    return diffs, float(np.median(engine)), float(np.median(bare))


def main() -> None:
    args = parse_args(__doc__.splitlines()[0])
    compile_runs, frames, rounds = (200, 5_000, 5) if args.quick else (1000, 20_000, 15)
    c_ms = compile_ms(compile_runs)
    diffs, engine_us, direct_us = overhead_us(frames, rounds)
    o_us = float(np.median(diffs))
    metrics = {
        "compile_ms": round(c_ms, 3),
        "overhead_us_per_frame": round(o_us, 2),
        "overhead_us_per_frame.range": f"{min(diffs):.2f}-{max(diffs):.2f}",
        "executor_us_per_frame": round(engine_us, 2),
        "direct_calls_us_per_frame": round(direct_us, 2),
        "blocks": BLOCKS,
        "rounds": rounds,
    }
    targets = {"compile_ms": "<= 2", "overhead_us_per_frame": "<= 50 (worst round)"}
    met = {"compile_ms": c_ms <= 2.0, "overhead_us_per_frame": max(diffs) <= 50.0}
    report("engine_overhead", metrics, targets, met)


if __name__ == "__main__":
    main()
