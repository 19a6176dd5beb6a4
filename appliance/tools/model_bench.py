"""Benchmark one ONNX model at a fixed input shape, in the spirit of onnxruntime_perf_test.

The model is opened by `appliance.models.session.load_model`, so provider fallback and
load errors are the appliance's own. A random tensor of the input's dtype and shape is
run `warmup` times unmeasured, then for `duration_s` seconds; each `session.run` is timed
with `time.perf_counter`. With `profile_path`, ONNX Runtime's profiler records the runs
and its operator events are written as our trace format (see `appliance.profiling`), one
`session.run` span per measured run around its operators.

Without a shape the input's declared dims are used where static; a model that leaves H and
W unknown gets the input size of the ocr block's recogniser or of the first decoder that
accepts it (`default_shape`), and the result says which (`shape_source`).
"""

from __future__ import annotations

import dataclasses
import json
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort

from appliance.models.session import LoadedModel, load_model
from appliance.profiling.ort_profile import (
    is_model_run,
    is_operator,
    profiling_session,
    read_profile,
)
from pipelines.models import Dim, ModelInfo, TensorInfo
from pipelines.spec import ModelSpec

Shape = tuple[int, ...]
Progress = Callable[[str], None]
PROGRESS_EVERY_S = 5.0  # a progress line this often during the measured runs


class BenchError(ValueError):
    """The benchmark cannot run as asked (shape or batch); the message says what to give."""


@dataclass(frozen=True, slots=True)
class BenchResult:
    """One benchmark: what ran, where, and how fast (latencies in milliseconds)."""

    model: str
    input_name: str
    dtype: str
    shape: Shape
    shape_source: str  # why this shape: --shape, the model's dims, or a default's name
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
    graph_optimization: str  # the session's level ("all" unless configured lower)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def bench_model(
    path: Path,
    batch: int | None = None,
    shape: Sequence[int] | None = None,
    duration_s: float = 10.0,
    provider: str | None = None,
    warmup: int = 20,
    threads: int = 0,
    profile_path: Path | None = None,
    progress: Progress | None = None,
) -> BenchResult:
    """Benchmark `path` on `provider` (tensorrt, cuda, cpu; None: the fastest that loads);
    raises ModelLoadError (file) or BenchError (shape, batch).
    `progress` gets a line for the chosen shape, every few seconds of the measured runs,
    and for the profile write."""
    say = progress or (lambda _line: None)
    # No provider named: the config's default (the fastest whose libraries load here, no
    # warning); one named: asked for, with a warning when it cannot be had.
    asked: dict[str, Any] = {} if provider is None else {"providers": [provider, "cpu"]}
    spec = ModelSpec.model_validate(
        {"path": path, "session": {"intra_op_threads": threads}, **asked}
    )
    loaded = load_model(path.stem, spec, lambda p: p)
    tensor = loaded.info.inputs[0]
    source = "--shape"
    if shape is None:
        shape, source = default_shape(loaded.info)
    dims = input_shape(tensor, batch, shape)
    say(f"input {tensor.name} {tensor.dtype} {_dims(dims)}: {source}")
    feed = {tensor.name: random_tensor(dims, tensor.dtype)}
    with tempfile.TemporaryDirectory(prefix="ort-profile-") as tmp:
        session = loaded.session
        if profile_path is not None:
            session = profiling_session(loaded, spec.session, Path(tmp))
        for _ in range(warmup):
            session.run(None, feed)
        latencies = timed_runs(session, feed, duration_s, say)
        if profile_path is not None:
            level = spec.session.graph_optimization
            _write_profile(profile_path, loaded, session, (dims[0], len(latencies), level), say)
    timing = _Timing(warmup, latencies, source, spec.session.graph_optimization)
    return _result(loaded, tensor, dims, timing, profile_path)


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


def input_shape(tensor: TensorInfo, batch: int | None, shape: Sequence[int]) -> Shape:
    """The shape to feed: `shape` with or without the batch dim, the batch dim from
    `batch` (default: the model's fixed batch, else 1)."""
    declared = tensor.shape
    if batch is not None and batch < 1:
        raise BenchError(f"--batch {batch}: must be at least 1")
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


@dataclass(frozen=True, slots=True)
class InputDefault:
    """The input size a consumer of a model uses when the model leaves H and W unknown."""

    size: tuple[int, int]  # (width, height)
    channels_last: bool  # NHWC rather than NCHW
    why: str


def input_defaults() -> dict[str, InputDefault]:
    """Per decoder kind (and "ocr"), the size it feeds a model with dynamic H and W.
    Imported here, not at module level: the decoders load only when needed."""
    from pipelines.blocks.ocr import DEFAULT_HEIGHT, OcrParams
    from pipelines.decoders import tf_od, yolo

    ocr_width = int(OcrParams.model_fields["max_width"].default)
    return {
        "tf_od": InputDefault(tf_od.DEFAULT_SIZE, True, "the tf_od decoder's default size"),
        "yolo": InputDefault(yolo.DEFAULT_SIZE, False, "the yolo decoder's default size"),
        "centerface": InputDefault(
            (640, 480), False, "a 640x480 frame, which the centerface decoder feeds as is"
        ),
        "dbnet": InputDefault((960, 544), False, "a 960x540 frame as the dbnet decoder sizes it"),
        "ocr": InputDefault((ocr_width, DEFAULT_HEIGHT), False, "the ocr block's recogniser size"),
    }


def default_shape(info: ModelInfo) -> tuple[Shape, str]:
    """The dims after the batch, and why: the declared ones where all are static, else
    H and W from the consumer that accepts the model (`accepting_kind`)."""
    tensor = info.inputs[0]
    declared = tensor.shape
    unknown = [i for i, d in enumerate(declared) if i and not _static(d)]
    if not unknown:
        return tuple(int(d) for d in declared[1:]), "the model's declared input"  # type: ignore[arg-type]
    kind = accepting_kind(info)
    default = input_defaults().get(kind or "")
    hw_axes = (1, 2) if default and default.channels_last else (2, 3)
    if default is None or len(declared) != 4 or not set(unknown) <= set(hw_axes):
        example = "x".join(str(d) if _static(d) else "300" for d in declared[1:])
        names = ", ".join(str(declared[i]) for i in unknown)
        raise BenchError(
            f"input {tensor.name!r} {_dims(declared)} has unknown dims [{names}] and no "
            f"decoder or block takes it: give --shape (the dims after the batch, e.g. {example})"
        )
    width, height = default.size
    filled = list(declared)
    for axis, value in zip(hw_axes, (height, width), strict=True):
        filled[axis] = value if axis in unknown else filled[axis]
    why = f"the model leaves H, W unknown: {default.why}, {width}x{height} (W x H)"
    return tuple(int(d) for d in filled[1:]), why  # type: ignore[arg-type]


def accepting_kind(info: ModelInfo) -> str | None:
    """ "ocr" when the ocr block's recogniser takes the model (its check is the strictest:
    the symbol list in the metadata must fit the output), else the first decoder kind, in
    registry order, whose compile-time checks pass, else None."""
    from pipelines.blocks.base import BlockBuildError
    from pipelines.blocks.ocr import CtcReader
    from pipelines.decoders import DECODERS, DecodeOptions, DecoderError, build_decoder

    try:
        CtcReader(info, input_defaults()["ocr"].size[0])
    except BlockBuildError:
        pass
    else:
        return "ocr"
    for kind in DECODERS:
        try:
            build_decoder(dataclasses.replace(info, decoder=kind), DecodeOptions())
        except DecoderError:
            continue
        return kind
    return None


def _static(dim: Dim) -> bool:
    return isinstance(dim, int) and dim > 0


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


def _write_profile(
    path: Path,
    loaded: LoadedModel,
    session: ort.InferenceSession,
    run: tuple[int, int, str],
    say: Progress,
) -> None:
    """Read ORT's profile, keep the measured runs, write our trace; say how big and how
    long (a long run's profile holds hundreds of MB of operator events). `run`: batch,
    measured runs, and the session's graph optimisation level (kept in `otherData`)."""
    batch, runs, level = run
    begin = time.perf_counter()
    say(f"profile: reading ORT's events for {runs} runs")
    trace = profile_trace(read_profile(session), loaded, session, batch)
    trace["traceEvents"] = _last_runs(trace["traceEvents"], runs)
    trace["otherData"]["graph_optimization"] = level
    text = json.dumps(trace)
    path.write_text(text, encoding="utf-8")
    mb = len(text.encode()) / 1e6
    events = len(trace["traceEvents"])
    say(f"profile: {events} events, {mb:.1f} MB written in {time.perf_counter() - begin:.1f} s")


def timed_runs(
    session: ort.InferenceSession,
    feed: dict[str, np.ndarray[Any, Any]],
    duration_s: float,
    say: Progress,
) -> list[float]:
    """Run until `duration_s` has passed (at least once); each run's seconds. Says how far
    it is every PROGRESS_EVERY_S seconds."""
    latencies: list[float] = []
    start = time.perf_counter()
    end, next_report = start + duration_s, start + PROGRESS_EVERY_S
    while not latencies or time.perf_counter() < end:
        begin = time.perf_counter()
        session.run(None, feed)
        latencies.append(time.perf_counter() - begin)
        if begin >= next_report:
            p50 = 1000.0 * float(np.median(latencies))
            done = f"{begin - start:.0f}/{duration_s:.0f} s"
            say(f"{done}: {len(latencies)} runs, p50 {p50:.2f} ms")
            next_report += PROGRESS_EVERY_S
    return latencies


@dataclass(frozen=True, slots=True)
class _Timing:
    """What was measured, and how the shape and session were chosen."""

    warmup: int
    latencies: list[float]
    shape_source: str
    graph_optimization: str


def _result(
    loaded: LoadedModel,
    tensor: TensorInfo,
    dims: Shape,
    timing: _Timing,
    profile_path: Path | None,
) -> BenchResult:
    latencies = timing.latencies
    ms = np.array(latencies) * 1000.0
    total_s = float(sum(latencies))
    runs_per_s = len(latencies) / total_s
    p50, p90, p99 = (float(v) for v in np.percentile(ms, [50, 90, 99]))
    return BenchResult(
        model=loaded.info.path,
        input_name=tensor.name,
        dtype=tensor.dtype,
        shape=dims,
        shape_source=timing.shape_source,
        batch=dims[0],
        requested_providers=loaded.requested_providers,
        providers=loaded.info.providers,
        warmup=timing.warmup,
        runs=len(latencies),
        duration_s=total_s,
        mean_ms=float(ms.mean()),
        p50_ms=p50,
        p90_ms=p90,
        p99_ms=p99,
        runs_per_s=runs_per_s,
        samples_per_s=runs_per_s * dims[0],
        profile=str(profile_path) if profile_path is not None else None,
        graph_optimization=timing.graph_optimization,
    )


def _dims(shape: Sequence[object]) -> str:
    return "[" + ", ".join("?" if d is None else str(d) for d in shape) + "]"
