"""Does dynamic batching pay? Four streams share one person_ssdlite batcher.

Four threads (stand-ins for four stream workers) each submit a preprocessed 300x300 RGB
uint8 sample and wait for its result, in a closed loop, for a fixed time. Two arms:
`batched` (max_batch_size 4, a 5 ms queue delay) and `unbatched` (max_batch_size 1), each
on a fresh batcher over the same loaded session (ONNX Runtime's default thread count),
alternating round by round in one run with the order rotated each round
(bench/_compare.py). Per round: batched fps ÷ the same round's unbatched fps; the
verdict takes the median's bootstrap 95 % interval.

On CPU a batch of 4 costs nearly 4 single runs (convolutions are already parallel over
the cores), so the target is only "no slower": speedup >= 1.0 by the interval's lower
bound. On a GPU a batch of 4 costs little more than one run and the speedup is larger.

    python bench/batching.py [--quick]    # quick: 4 rounds of 3 s per arm; full: 12 of 8 s
"""

from __future__ import annotations

import logging
import statistics
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from time import perf_counter

import cv2
import numpy as np
from _common import ROOT, parse_args, report_judged
from _compare import alternate, judge, method, ratios

from appliance.models import LoadedModel, ModelBatcher, load_model
from pipelines.models import Tensor
from pipelines.spec import BatchingSpec, ModelSpec

MODEL = ROOT / "configs" / "models" / "person_ssdlite.onnx"
IMAGES = ROOT / "configs" / "media" / "sources"
STREAMS = 4
WARMUP_S = 1.0  # a fresh batcher's first runs pay for buffers and thread start-up
BATCH_DELAY_MS = 5.0  # long enough for 4 closed-loop streams to meet, short for latency
ARMS = {"batched": STREAMS, "unbatched": 1}  # arm -> max_batch_size
TARGET = 1.0  # on CPU: batching must not cost throughput


@dataclass(frozen=True)
class Run:
    fps: float
    mean_batch_size: float
    p50_ms: float
    p99_ms: float


def samples() -> list[Tensor]:
    """One photo per stream as a model sample: RGB uint8 [300, 300, 3]."""
    rgb = []
    for path in sorted(IMAGES.glob("*.png")):
        bgr = cv2.imread(str(path))
        if bgr is None:
            raise SystemExit(f"cannot read {path}")
        rgb.append(np.ascontiguousarray(cv2.resize(bgr, (300, 300))[:, :, ::-1]))
    return [rgb[i % len(rgb)] for i in range(STREAMS)]


def stream(
    batcher: ModelBatcher, sample: Tensor, name: str, until: float, out: list[float]
) -> None:
    """Submit, wait, repeat until `until` (perf_counter s); appends latencies in s."""
    while (start := perf_counter()) < until:
        batcher.submit(sample, name).result(timeout=30)
        out.append(perf_counter() - start)


def measure(model: LoadedModel, max_batch_size: int, seconds: float, inputs: list[Tensor]) -> Run:
    """Run the closed loop for `seconds` after a warm-up; fps counts every stream."""
    batching = BatchingSpec(max_batch_size=max_batch_size, max_queue_delay_ms=BATCH_DELAY_MS)
    with ModelBatcher(model, batching) as batcher:
        batcher.set_producers(len(inputs))  # as the runtime does: the streams leasing it
        _closed_loop(batcher, inputs, WARMUP_S)
        batches, samples_before = batcher.batches, batcher.samples
        latencies, elapsed = _closed_loop(batcher, inputs, seconds)
        mean_batch = (batcher.samples - samples_before) / max(1, batcher.batches - batches)
    ms = np.array(latencies) * 1000.0
    return Run(
        fps=len(latencies) / elapsed,
        mean_batch_size=mean_batch,
        p50_ms=float(np.percentile(ms, 50)),
        p99_ms=float(np.percentile(ms, 99)),
    )


def _closed_loop(
    batcher: ModelBatcher, inputs: list[Tensor], seconds: float
) -> tuple[list[float], float]:
    begin = perf_counter()
    per_stream: list[list[float]] = [[] for _ in inputs]
    threads = [
        threading.Thread(
            target=stream, args=(batcher, x, f"s{i}", begin + seconds, per_stream[i]), name=f"s{i}"
        )
        for i, x in enumerate(inputs)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return [lat for lats in per_stream for lat in lats], perf_counter() - begin


def main() -> None:
    args = parse_args(__doc__.splitlines()[0])
    rounds, seconds = (4, 3.0) if args.quick else (12, 8.0)
    logging.basicConfig(format="%(levelname)s %(name)s: %(message)s")

    cfg = ModelSpec(path=MODEL, decoder="tf_od")  # default providers: cuda, then cpu
    model = load_model("person", cfg, Path.resolve)
    inputs = samples()
    runs: dict[str, list[Run]] = {arm: [] for arm in ARMS}

    def arm(name: str) -> Callable[[], float]:
        def run() -> float:
            runs[name].append(measure(model, ARMS[name], seconds, inputs))
            return runs[name][-1].fps

        return run

    def progress(r: int, fps: dict[str, list[float]]) -> None:
        shown = ", ".join(f"{name} {values[-1]:.1f} fps" for name, values in fps.items())
        print(f"round {r + 1}/{rounds}: {shown}", flush=True)

    provider = model.info.providers[0]
    print(f"person_ssdlite, {STREAMS} streams, {rounds} rounds of {seconds:g} s, {provider}")
    fps = alternate({name: arm(name) for name in ARMS}, rounds, progress)
    speedup = judge(ratios(fps["batched"], fps["unbatched"]), at_least=TARGET)

    def median(name: str, field: str) -> float:
        return round(float(statistics.median(getattr(r, field) for r in runs[name])), 2)

    metrics = {
        "speedup": round(speedup.median, 3),
        "speedup.interval": f"{speedup.low:.3f}-{speedup.high:.3f}",
        "fps_batched": median("batched", "fps"),
        "fps_unbatched": median("unbatched", "fps"),
        "mean_batch_size": median("batched", "mean_batch_size"),
        "p50_ms_batched": median("batched", "p50_ms"),
        "p99_ms_batched": median("batched", "p99_ms"),
        "p50_ms_unbatched": median("unbatched", "p50_ms"),
        "p99_ms_unbatched": median("unbatched", "p99_ms"),
        "provider": provider,
    }
    how = method(
        f"{STREAMS} closed-loop submitter threads on one person_ssdlite batcher (300x300 "
        f"uint8), {seconds:g} s per arm after a {WARMUP_S:g} s warm-up on a fresh batcher; "
        f"batched: max_batch_size {STREAMS}, {BATCH_DELAY_MS:g} ms queue delay; unbatched: "
        f"max_batch_size 1; provider {provider}",
        list(ARMS), rounds, f"each arm for {seconds:g} s",
        ratio="batched fps ÷ the same round's unbatched fps",
        arm_figures="fps, mean batch size and latency: the median over the rounds",
    )  # fmt: skip
    report_judged("batching", metrics, {"speedup": speedup}, how)


if __name__ == "__main__":
    main()
