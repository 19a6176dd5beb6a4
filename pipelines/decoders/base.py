"""The one interface every model output format implements.

A decoder is built once per detect block at compile time (where it checks the model's
declared inputs and outputs and raises `DecoderError` naming what does not match), then
per frame turns a BGR image into the model's input sample and the model's outputs back
into `Detections` in the frame's pixel coordinates.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol

import numpy as np

from pipelines.decoders.prologue import Prologue
from pipelines.models import Dim, ModelInfo, Tensor, TensorInfo
from pipelines.types import Detections, Image


class DecoderError(ValueError):
    """The model does not fit the decoder kind (wrong outputs, shapes or dtypes)."""


@dataclass(frozen=True, slots=True)
class DecodeOptions:
    """Per-block decoding parameters."""

    confidence: float = 0.5  # minimum score kept, 0..1
    nms_iou: float = 0.5  # IoU above which the lower-scored box is suppressed
    max_detections: int = 300


@dataclass(frozen=True, slots=True)
class Transform:
    """How model-input coordinates map back to the frame: frame = (model - pad) / scale."""

    scale_x: float
    scale_y: float
    pad_x: float
    pad_y: float
    frame_w: int
    frame_h: int


class Decoder(Protocol):
    def preprocess(self, image: Image) -> tuple[Tensor, Transform]:
        """BGR uint8 HxWx3 frame -> one model sample (no batch dim) and its transform."""
        ...

    def decode(self, outputs: Sequence[Tensor], transform: Transform) -> Detections:
        """One sample's model outputs (no batch dim) -> detections in frame pixels."""
        ...


class DecoderFactory(Protocol):
    def __call__(self, info: ModelInfo, options: DecodeOptions) -> Decoder: ...

    def prologue(self, info: ModelInfo) -> Prologue | None:
        """The pixel preprocessing this decoder would do on the host for the model file
        `info` describes, as a `Prologue` the runtime can put into the graph (None: the
        kind has none). Raises DecoderError when the model does not fit the kind."""
        ...


# Compile-time checks shared by the decoders. They raise `DecoderError` with the model id,
# what the decoder expects and what the model declares, so a config mistake reads as one line.

Layout = Literal["NCHW", "NHWC"]


@dataclass(frozen=True, slots=True)
class ImageInput:
    """A model's single image input as a decoder reads it."""

    dtype: np.dtype[Any]
    fixed_size: tuple[int, int] | None  # (width, height) when the model fixes both


def composed(info: ModelInfo, kind: str, expected: Prologue) -> bool:
    """Whether the session runs `expected` in its graph (the decoder then hands it BGR
    uint8 images); DecoderError when the runtime composed some other prologue."""
    if info.prologue is None:
        return False
    if info.prologue != expected:
        raise mismatch(info, kind, f"the graph prologue {expected}", f"{info.prologue}")
    return True


def bgr_sample(image: Image) -> Tensor:
    """The geometry's BGR uint8 HxWx3 image as a composed session's sample: as is when
    C-contiguous (a frame, a resize), else one copy (a view the batcher cannot stack)."""
    return np.ascontiguousarray(image)


def describe(tensors: Sequence[TensorInfo]) -> str:
    """'images float32 [1,3,640,640], ...': tensors as an error message shows them."""
    return ", ".join(f"{t.name} {t.dtype} [{','.join(map(_dim, t.shape))}]" for t in tensors)


def mismatch(info: ModelInfo, kind: str, expected: str, actual: str) -> DecoderError:
    """The one error shape: model, decoder kind, expected, actual."""
    return DecoderError(
        f"model {info.id!r}: decoder {kind!r} expects {expected}; the model has {actual}"
    )


def check_image_input(
    info: ModelInfo, kind: str, layout: Layout, dtypes: Sequence[str]
) -> ImageInput:
    """Check that the model takes one 3-channel image of `layout` in one of `dtypes`."""
    channel_axis, h_axis, w_axis = (1, 2, 3) if layout == "NCHW" else (3, 1, 2)
    dims = "[N,3,H,W]" if layout == "NCHW" else "[N,H,W,3]"
    expected = f"one input {'|'.join(dtypes)} {dims} ({layout} RGB)"
    if len(info.inputs) != 1:
        raise mismatch(info, kind, expected, f"inputs {describe(info.inputs)}")
    tensor = info.input
    shape = tensor.shape
    if tensor.dtype not in dtypes or len(shape) != 4 or not dim_is(shape[channel_axis], 3):
        raise mismatch(info, kind, expected, f"input {describe([tensor])}")
    h, w = shape[h_axis], shape[w_axis]
    fixed = (w, h) if isinstance(w, int) and isinstance(h, int) and w > 0 and h > 0 else None
    return ImageInput(np.dtype(tensor.dtype), fixed)


def resolve_size(info: ModelInfo, kind: str, image: ImageInput) -> tuple[int, int] | None:
    """Input (width, height): the config's `input_size`, else the model's fixed size, else
    None (the decoder's default applies). A config size that contradicts a fixed model
    size is an error now rather than an ONNX Runtime shape error on the first frame."""
    if info.input_size is None:
        return image.fixed_size
    if image.fixed_size is not None and image.fixed_size != info.input_size:
        raise mismatch(
            info,
            kind,
            f"the configured input_size {_wh(info.input_size)}",
            f"a fixed input size {_wh(image.fixed_size)}",
        )
    return info.input_size


def dim_is(d: Dim, value: int) -> bool:
    """A declared dim equals `value`, or is symbolic/unknown (so it may at run time)."""
    return not isinstance(d, int) or d == value


def _dim(d: Dim) -> str:
    return "?" if d is None else str(d)


def _wh(size: tuple[int, int]) -> str:
    return f"{size[0]}x{size[1]}"


def check_multiple(info: ModelInfo, kind: str, size: tuple[int, int] | None, multiple: int) -> None:
    """Fully convolutional detectors (CenterFace, DBNet) need sides in multiples of their
    stride; a configured or declared size that is not is a build-time error."""
    if size is not None and (size[0] % multiple or size[1] % multiple):
        source = "the configured input_size" if info.input_size else "the model's input"
        raise DecoderError(
            f"model {info.id!r}: decoder {kind!r} needs an input size in multiples of "
            f"{multiple}; {source} is {size[0]}x{size[1]}"
        )


def convolutional_size(info: ModelInfo, kind: str, multiple: int) -> tuple[int, int] | None:
    """A fully convolutional model's float32 NCHW image size (width, height): configured
    or fixed, checked to be multiples of `multiple`; None: sized per frame."""
    size = resolve_size(info, kind, check_image_input(info, kind, "NCHW", ("float32",)))
    check_multiple(info, kind, size, multiple)
    return size
