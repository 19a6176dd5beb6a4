"""Engine overhead: compile time and per-frame executor cost of a 10-block workflow.

Three arms alternate round by round in one run, the order rotated each round
(bench/_compare.py); each is a timing, not a throughput:
- `executor`: the compiled workflow's `run` on one frame, N times: µs per frame;
- `direct`: the same 10 no-op functions called in a plain loop on the frame's image, N
  times: µs per frame. Per round, executor − direct is all the engine's own cost
  (argument gathering, timing each block, storing outputs, the result). Target ≤ 50 µs
  per frame (Roboflow quotes 1–2 ms), by the upper bound of the median's bootstrap 95 %
  interval over the rounds;
- `compile`: `compile_workflow` of the 10-block chain of trivial blocks, no models, K
  times (after a warm-up): the round's median in ms. Target ≤ 2 ms (Roboflow quotes
  10–25 ms), by the interval's upper bound.

    python bench/engine_overhead.py [--quick]   # quick: 8 rounds; full: 30 rounds (~10 s)
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import numpy as np
from _common import parse_args, report
from _compare import alternate, judge, method

from pipelines.blocks.base import BlockParams, BlockType, BuildContext, StepFactory, stateless
from pipelines.compiler import compile_workflow
from pipelines.registry import BlockRegistry
from pipelines.types import Frame

BLOCKS = 10
COMPILE_MS = 2.0  # target: compile at most (Roboflow: 10-25 ms)
OVERHEAD_US = 50.0  # target: the executor's own cost per frame at most (Roboflow: 1-2 ms)


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


def _noop(image: Any) -> Any:
    return image


def arms(frames: int, compiles: int) -> dict[str, Callable[[], float]]:
    """The three timed arms: executor and direct in µs per frame, compile in ms."""
    doc, ctx = workflow(), BuildContext(models={})
    run = compile_workflow(doc, ctx, REGISTRY).instantiate().run
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

    def compiling() -> float:
        times = []
        for _ in range(compiles):
            t0 = time.perf_counter()
            compile_workflow(doc, ctx, REGISTRY)
            times.append(time.perf_counter() - t0)
        return float(np.median(times)) * 1000

    for _ in range(20):
        compile_workflow(doc, ctx, REGISTRY)  # warm-up: imports, pydantic caches
    for _ in range(min(frames, 1000)):
        run(frame)  # warm-up: the executor's first calls
    return {"executor": executor, "direct": direct, "compile": compiling}


def main() -> None:
    args = parse_args(__doc__.splitlines()[0])
    rounds, frames, compiles = (8, 5_000, 40) if args.quick else (30, 20_000, 100)
    timed = alternate(arms(frames, compiles), rounds)
    diffs = [e - d for e, d in zip(timed["executor"], timed["direct"], strict=True)]
    overhead = judge(diffs, at_most=OVERHEAD_US)
    compiled = judge(timed["compile"], at_most=COMPILE_MS)
    metrics = {
        "compile_ms": round(compiled.median, 3),
        "compile_ms.interval": f"{compiled.low:.3f}-{compiled.high:.3f}",
        "overhead_us_per_frame": round(overhead.median, 2),
        "overhead_us_per_frame.interval": f"{overhead.low:.2f}-{overhead.high:.2f}",
        "overhead_us_per_frame.range": f"{min(diffs):.2f}-{max(diffs):.2f}",
        "executor_us_per_frame": round(float(np.median(timed["executor"])), 2),
        "direct_calls_us_per_frame": round(float(np.median(timed["direct"])), 2),
        "blocks": BLOCKS,
        "rounds": rounds,
    }
    how = method(
        f"a {BLOCKS}-block chain of no-op blocks, no models: `executor` runs the compiled "
        f"workflow on one 960x540 frame {frames} times (µs per frame); `direct` calls the "
        f"same {BLOCKS} no-op functions in a loop {frames} times (µs per frame); `compile` "
        f"compiles the workflow {compiles} times (the round's median, ms); warmed up first",
        ["executor", "direct", "compile"], rounds, "each arm once",
        figure="per round: overhead = executor − direct µs per frame of the same round, and "
        "compile ms; the median of the rounds (a timing, not a ratio)",
    )  # fmt: skip
    targets = {
        "compile_ms": f"<= {COMPILE_MS:g} (95 % interval's upper bound)",
        "overhead_us_per_frame": f"<= {OVERHEAD_US:g} (95 % interval's upper bound)",
    }
    verdicts = {"compile_ms": compiled, "overhead_us_per_frame": overhead}
    report(
        "engine_overhead", metrics, targets, {k: v.met for k, v in verdicts.items()},
        method=how, verdicts={k: v.as_json() for k, v in verdicts.items()},
    )  # fmt: skip


if __name__ == "__main__":
    main()
