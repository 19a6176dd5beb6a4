"""Benchmark one ONNX model at a fixed input shape, in the spirit of onnxruntime_perf_test.

The model is opened by `appliance.models.session.load_model`, so provider fallback and
load errors are the appliance's own. A random tensor of the input's dtype and shape is
run `warmup` times unmeasured, then for `duration_s` seconds; each `session.run` is timed
with `time.perf_counter`. With `profile_path`, ONNX Runtime's profiler records the runs
and its operator events are written as our trace format (see `appliance.profiling`), one
`session.run` span per measured run around its operators.
"""

from __future__ import annotations

import json
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort

from appliance.config import ModelConfig, SessionConfig
from appliance.models.session import LoadedModel, load_model
from appliance.profiling.ort_profile import (
    is_model_run,
    is_operator,
    profiling_session,
    read_profile,
)
from pipelines.models import TensorInfo

Shape = tuple[int, ...]


class BenchError(ValueError):
    """The benchmark cannot run as asked (shape or batch); the message says what to give."""


@dataclass(frozen=True, slots=True)
class BenchResult:
    """One benchmark: what ran, where, and how fast (latencies in milliseconds)."""

    model: str
    input_name: str
    dtype: str
    shape: Shape
    batch: int
    requested_providers: tuple[str, ...]
    providers: tuple[str, ...]
    warmup: int
    runs: int
    duration_s: float  # measured wall time of the timed runs
    mean_ms: float
    p50_ms: float
    p90_ms: float
    p99_ms: float
    runs_per_s: float
    samples_per_s: float  # runs/s × batch
    profile: str | None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def bench_model(
    path: Path,
    batch: int | None = None,
    shape: Sequence[int] | None = None,
    duration_s: float = 10.0,
    provider: str = "cuda",
    warmup: int = 20,
    threads: int = 0,
    profile_path: Path | None = None,
) -> BenchResult:
    """Benchmark `path`; raises ModelLoadError (file) or BenchError (shape, batch)."""
    spec = ModelConfig(
        path=path,
        providers=[provider, "cpu"],  # type: ignore[list-item]  # checked by the CLI
        session=SessionConfig(intra_op_threads=threads),
    )
    loaded = load_model(path.stem, spec, lambda p: p)
    tensor = loaded.info.inputs[0]
    dims = input_shape(tensor, batch, shape)
    feed = {tensor.name: random_tensor(dims, tensor.dtype)}
    with tempfile.TemporaryDirectory(prefix="ort-profile-") as tmp:
        session = loaded.session
        if profile_path is not None:
            session = profiling_session(loaded, spec.session, Path(tmp))
        for _ in range(warmup):
            session.run(None, feed)
        latencies = _timed_runs(session, feed, duration_s)
        if profile_path is not None:
            trace = profile_trace(read_profile(session), loaded, session, dims[0])
            trace["traceEvents"] = _last_runs(trace["traceEvents"], len(latencies))
            profile_path.write_text(json.dumps(trace), encoding="utf-8")
    return _result(loaded, tensor, dims, warmup, latencies, profile_path)


def parse_shape(text: str) -> Shape:
    """ "1,300,300,3" or "300x300x3" → a tuple of positive ints."""
    parts = text.replace("x", ",").replace("X", ",").split(",")
    try:
        dims = tuple(int(p) for p in parts)
    except ValueError:
        raise BenchError(f"shape {text!r}: expected integers such as 1,300,300,3") from None
    if any(d < 1 for d in dims):
        raise BenchError(f"shape {text!r}: every dim must be at least 1")
    return dims


def input_shape(tensor: TensorInfo, batch: int | None, shape: Sequence[int] | None) -> Shape:
    """The shape to feed: `shape` (with or without the batch dim) or the declared one,
    the batch dim from `batch` (default: the model's fixed batch, else 1)."""
    declared = tensor.shape
    if batch is not None and batch < 1:
        raise BenchError(f"--batch {batch}: must be at least 1")
    if shape is None:
        unknown = [str(d) for d in declared[1:] if not isinstance(d, int)]
        if unknown:
            raise BenchError(
                f"input {tensor.name!r} {_dims(declared)} has unknown dims "
                f"[{', '.join(unknown)}]: give --shape (the dims after the batch, "
                f"e.g. {'x'.join(str(d) if isinstance(d, int) else '300' for d in declared[1:])})"
            )
        shape = [int(d) for d in declared[1:]]  # type: ignore[arg-type]  # all ints here
    if len(shape) == len(declared):
        if batch is not None and batch != shape[0]:
            raise BenchError(f"--batch {batch} contradicts --shape batch {shape[0]}")
        dims: Shape = tuple(shape)
    elif len(shape) == len(declared) - 1:
        dims = (batch or tensor.fixed_batch or 1, *shape)
    else:
        raise BenchError(
            f"--shape has {len(shape)} dims; input {tensor.name!r} {_dims(declared)} "
            f"takes {len(declared)} (or {len(declared) - 1} without the batch)"
        )
    _check_fixed(tensor, dims)
    return dims


def _check_fixed(tensor: TensorInfo, dims: Shape) -> None:
    """Every dim the model fixes must be fed as declared."""
    for i, (want, got) in enumerate(zip(tensor.shape, dims, strict=True)):
        if not isinstance(want, int) or want < 1 or want == got:
            continue
        if i == 0:
            raise BenchError(
                f"input {tensor.name!r} {_dims(tensor.shape)} has a fixed batch of {want}: "
                f"batch {got} is not possible (use --batch {want})"
            )
        raise BenchError(
            f"input {tensor.name!r} {_dims(tensor.shape)}: dim {i} is {want}, --shape gives {got}"
        )


def random_tensor(shape: Shape, dtype: str, seed: int = 0) -> np.ndarray[Any, Any]:
    """Random values of `dtype`: integers 0..255 (bool 0..1), floats in [0, 1)."""
    rng = np.random.default_rng(seed)
    kind = np.dtype(dtype)
    if kind == np.bool_:
        return rng.integers(0, 2, size=shape).astype(np.bool_)
    if np.issubdtype(kind, np.integer):
        return rng.integers(0, 256, size=shape).astype(kind)
    return rng.random(size=shape, dtype=np.float32).astype(kind)


def profile_trace(
    events: list[dict[str, Any]], loaded: LoadedModel, session: ort.InferenceSession, batch: int
) -> dict[str, Any]:
    """ORT's profile events (wall-clock µs, from `read_profile`) as our trace: its
    `model_run` events, which bracket each run, become `session.run` spans; its operator
    events are kept with ORT's args."""
    model = loaded.info.path
    out: list[dict[str, Any]] = []
    for event in events:
        if is_model_run(event):
            out.append(
                {
                    **event,
                    "cat": "model",
                    "name": "session.run",
                    "args": {"model": model, "batch_size": batch},
                }
            )
        elif is_operator(event):
            out.append(event)
    return {
        "traceEvents": out,
        "displayTimeUnit": "ms",
        "otherData": {
            "model": model,
            "requested_providers": list(loaded.requested_providers),
            "providers": list(session.get_providers()),
        },
    }


def _last_runs(events: list[dict[str, Any]], runs: int) -> list[dict[str, Any]]:
    """Only the last `runs` spans (the measured ones, not warm-up) and their operators."""
    spans = [e for e in events if e["name"] == "session.run"][-runs:] if runs else []
    start = spans[0]["ts"] if spans else float("inf")
    return [e for e in events if e["ts"] >= start]


def _timed_runs(
    session: ort.InferenceSession, feed: dict[str, np.ndarray[Any, Any]], duration_s: float
) -> list[float]:
    """Run until `duration_s` has passed (at least once); each run's seconds."""
    latencies: list[float] = []
    end = time.perf_counter() + duration_s
    while not latencies or time.perf_counter() < end:
        begin = time.perf_counter()
        session.run(None, feed)
        latencies.append(time.perf_counter() - begin)
    return latencies


def _result(
    loaded: LoadedModel,
    tensor: TensorInfo,
    dims: Shape,
    warmup: int,
    latencies: list[float],
    profile_path: Path | None,
) -> BenchResult:
    ms = np.array(latencies) * 1000.0
    total_s = float(sum(latencies))
    runs_per_s = len(latencies) / total_s
    p50, p90, p99 = (float(v) for v in np.percentile(ms, [50, 90, 99]))
    return BenchResult(
        model=loaded.info.path,
        input_name=tensor.name,
        dtype=tensor.dtype,
        shape=dims,
        batch=dims[0],
        requested_providers=loaded.requested_providers,
        providers=loaded.info.providers,
        warmup=warmup,
        runs=len(latencies),
        duration_s=total_s,
        mean_ms=float(ms.mean()),
        p50_ms=p50,
        p90_ms=p90,
        p99_ms=p99,
        runs_per_s=runs_per_s,
        samples_per_s=runs_per_s * dims[0],
        profile=str(profile_path) if profile_path is not None else None,
    )


def _dims(shape: Sequence[object]) -> str:
    return "[" + ", ".join("?" if d is None else str(d) for d in shape) + "]"
