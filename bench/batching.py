"""Does dynamic batching pay? Four streams share one person_ssdlite batcher.

Four threads (stand-ins for four stream workers) each submit a preprocessed 300x300 RGB
uint8 sample and wait for its result, in a closed loop, for a fixed time: once with
max_batch_size 4 and once with max_batch_size 1 (no batching). The session keeps ONNX
Runtime's default thread count.

On CPU a batch of 4 costs nearly 4 single runs (convolutions are already parallel over
the cores), so the target is only "no slower" (speedup >= 1.0); on a GPU a batch of 4
costs little more than one run and the speedup is much larger.

    python bench/batching.py [--quick]    # quick: ~8 s per config; full: ~30 s
Writes bench/results/batching.json: {"metrics": ..., "targets": ..., "met": ...}.
"""

from __future__ import annotations

import argparse
import json
import logging
import threading
from dataclasses import dataclass
from pathlib import Path
from time import perf_counter

import cv2
import numpy as np

from appliance.config import BatchingConfig, ModelConfig
from appliance.models import LoadedModel, ModelBatcher, load_model
from pipelines.models import Tensor

REPO = Path(__file__).resolve().parents[1]
MODEL = REPO / "configs" / "models" / "person_ssdlite.onnx"
IMAGES = REPO / "configs" / "media" / "sources"
RESULTS = REPO / "bench" / "results" / "batching.json"
STREAMS = 4
WARMUP_S = 1.0  # first runs pay for ORT's allocations and thread start-up
BATCH_DELAY_MS = 5.0  # long enough for 4 closed-loop streams to meet, short for latency
TARGETS = {"speedup": 1.0}  # on CPU: batching must not cost throughput


@dataclass(frozen=True)
class Run:
    name: str
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
    batching = BatchingConfig(max_batch_size=max_batch_size, max_queue_delay_ms=BATCH_DELAY_MS)
    with ModelBatcher(model, batching) as batcher:
        _closed_loop(batcher, inputs, WARMUP_S)
        batches, samples_before = batcher.batches, batcher.samples
        latencies, elapsed = _closed_loop(batcher, inputs, seconds)
        mean_batch = (batcher.samples - samples_before) / max(1, batcher.batches - batches)
    ms = np.array(latencies) * 1000.0
    return Run(
        name=f"max_batch_size={max_batch_size}",
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
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="~8 s per config instead of ~30 s")
    seconds = 8.0 if parser.parse_args().quick else 30.0
    logging.basicConfig(format="%(levelname)s %(name)s: %(message)s")

    cfg = ModelConfig(path=MODEL, decoder="tf_od")  # default providers: cuda, then cpu
    model = load_model("person", cfg, Path.resolve)
    inputs = samples()
    batched = measure(model, STREAMS, seconds, inputs)
    unbatched = measure(model, 1, seconds, inputs)

    print(f"person_ssdlite, {STREAMS} streams, {seconds:.0f} s each, {model.info.providers[0]}")
    row = "{:<18} {:>9} {:>10} {:>8} {:>8}"
    print(row.format("config", "frames/s", "mean batch", "p50 ms", "p99 ms"))
    for r in (batched, unbatched):
        cells = (f"{r.fps:.1f}", f"{r.mean_batch_size:.2f}", f"{r.p50_ms:.1f}", f"{r.p99_ms:.1f}")
        print(row.format(r.name, *cells))
    metrics = {
        "fps_batched": round(batched.fps, 1),
        "fps_unbatched": round(unbatched.fps, 1),
        "speedup": round(batched.fps / unbatched.fps, 3),
        "mean_batch_size": round(batched.mean_batch_size, 2),
        "p50_ms_batched": round(batched.p50_ms, 2),
        "p99_ms_batched": round(batched.p99_ms, 2),
        "p50_ms_unbatched": round(unbatched.p50_ms, 2),
        "p99_ms_unbatched": round(unbatched.p99_ms, 2),
    }
    met = {name: metrics[name] >= target for name, target in TARGETS.items()}
    print(f"speedup {metrics['speedup']:.2f}x (target >= {TARGETS['speedup']}): {met}")
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    report = {"metrics": metrics, "targets": TARGETS, "met": met}
    RESULTS.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
