"""Warm-up at load: each batch size a model will see, run once before the first frame.

A session's first run at a shape pays for memory allocation and kernel selection (CUDA:
cuDNN's algorithm search; TensorRT: an engine build for a shape outside its profile,
minutes for a large model), and without a warm-up the first frames of every stream pay
it. So `load_model` runs the session once per batch size, with zeros, before any stream
starts. It reads the session's own input (name, type, shape), not `ModelInfo.inputs`:
a model composed with a preprocessing prologue takes uint8 NHWC frames instead.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from typing import Any, Protocol

import numpy as np

from appliance.models.errors import ModelLoadError, describe_ort_error
from pipelines.spec import ModelSpec

logger = logging.getLogger("appliance.models")

# The session's input type -> the numpy dtype of its zeros.
_ONNX_TYPES = {
    "tensor(float)": np.float32,
    "tensor(float16)": np.float16,
    "tensor(double)": np.float64,
    "tensor(uint8)": np.uint8,
    "tensor(int8)": np.int8,
}
_CHANNELS = 3  # a frame's colour channels: where they are tells the layout
_RANK = 4  # (batch, then three dims of one image)


class Warmable(Protocol):
    """What warm-up needs of a loaded model (session.LoadedModel has it): a Protocol, so
    that this module, which session.py calls, does not import it back."""

    @property
    def id(self) -> str: ...

    @property
    def session(self) -> Any: ...  # an onnxruntime.InferenceSession


def warm_up(model: Warmable, spec: ModelSpec) -> tuple[int, ...]:
    """Run the model once per batch size up to `spec.batching.max_batch_size` (or its
    fixed batch); the sizes it ran, largest first, () when the input's size is unknown
    (skipped, said at DEBUG). ModelLoadError naming the model and the batch size when a
    run fails."""

    arg = model.session.get_inputs()[0]
    image = image_dims(list(arg.shape), spec.input_size)
    dtype = _ONNX_TYPES.get(str(arg.type))
    if image is None or dtype is None:
        logger.debug(
            "model %r: no warm-up: input %s %s %s has no known size (set input_size)",
            model.id,
            arg.name,
            arg.type,
            arg.shape,
        )
        return ()
    sizes = batch_sizes(arg.shape[0], spec.batching.max_batch_size)
    started = time.perf_counter()
    for size in sizes:
        try:
            model.session.run(None, {arg.name: np.zeros((size, *image), dtype)})
        except Exception as exc:  # ORT's errors share no base class but Exception
            reason = describe_ort_error(exc)
            raise ModelLoadError(
                f"model {model.id!r}: warm-up with batch size {size} failed: {reason}"
            ) from exc
    elapsed_ms = (time.perf_counter() - started) * 1000
    shown = ", ".join(map(str, sizes))
    logger.info("model %r: warmed up batch sizes %s in %.0f ms", model.id, shown, elapsed_ms)
    return sizes


def image_dims(
    shape: Sequence[object], input_size: tuple[int, int] | None
) -> tuple[int, ...] | None:
    """The input's dims after the batch dim: fixed in the model, or (for a 4-d input)
    from `input_size` (width, height), laid out as the 3-channel dim shows (NCHW or
    NHWC); None when neither tells them."""
    rest = list(shape[1:])
    fixed = [d for d in rest if isinstance(d, int) and d > 0]
    if len(fixed) == len(rest):
        return tuple(fixed)
    if input_size is None or len(shape) != _RANK:
        return None
    width, height = input_size
    if rest[0] == _CHANNELS:
        return (_CHANNELS, height, width)
    if rest[2] == _CHANNELS:
        return (height, width, _CHANNELS)
    return None


def batch_sizes(batch_dim: object, max_batch_size: int) -> tuple[int, ...]:
    """The batch sizes to run, largest first: a fixed batch dim's own; else 1, the
    largest, and the powers of two between: at most 10 runs (max_batch_size 256). The
    largest goes first: TensorRT's shape profile then spans the rest without a rebuild;
    a size not warmed pays only its own allocation."""
    if isinstance(batch_dim, int) and batch_dim > 0:
        return (batch_dim,)
    sizes = {1, max_batch_size}
    power = 2
    while power < max_batch_size:
        sizes.add(power)
        power *= 2
    return tuple(sorted(sizes, reverse=True))
