"""Engine overhead: compile time and per-frame executor cost of a 10-block workflow.

- compile: `compile_workflow` of a 10-block chain of trivial blocks, no models (median of
  many compilations after a warm-up). Target ≤ 2 ms (Roboflow quotes 10–25 ms).
- overhead: the executor's time per frame minus the blocks' own time (the sum of their
  spans), blocks doing trivial work. Target ≤ 50 µs per frame (Roboflow: 1–2 ms).
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


def overhead_us(frames: int) -> tuple[float, float]:
    """(median executor overhead per frame, median blocks' own time per frame), µs."""
    run = compile_workflow(workflow(), BuildContext(models={}), REGISTRY).instantiate().run
    image = np.zeros((540, 960, 3), np.uint8)
    frame = Frame("bench", 0, None, time.time(), time.perf_counter(), image)
    overheads, own = [], []
    for _ in range(frames):
        t0 = time.perf_counter()
        result = run(frame)
        total = time.perf_counter() - t0
        blocks = sum(s[1] - s[0] for s in result.block_spans if s is not None)
        overheads.append(total - blocks)
        own.append(blocks)
    return float(np.median(overheads)) * 1e6, float(np.median(own)) * 1e6


def main() -> None:
    args = parse_args(__doc__.splitlines()[0])
    compile_runs, frames = (200, 20_000) if args.quick else (1000, 200_000)
    c_ms = compile_ms(compile_runs)
    o_us, own_us = overhead_us(frames)
    metrics = {
        "compile_ms": round(c_ms, 3),
        "overhead_us_per_frame": round(o_us, 2),
        "blocks_own_us_per_frame": round(own_us, 2),
        "blocks": BLOCKS,
    }
    targets = {"compile_ms": "<= 2", "overhead_us_per_frame": "<= 50"}
    met = {"compile_ms": c_ms <= 2.0, "overhead_us_per_frame": o_us <= 50.0}
    report("engine_overhead", metrics, targets, met)


if __name__ == "__main__":
    main()
