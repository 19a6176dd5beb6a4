"""`classify`: run an image classifier on crops (one row each) or on the whole image.

```yaml
- id: colour
  type: classify
  model: colours          # a classifier: input float [N,3,H,W], output [N,C]
  crops: car_crops        # optional: a crop block's output; without it, the whole image
  image: frame            # optional: the image classified when no crops are given
  top_k: 3
  input_size: [224, 224]  # optional (width, height): else the model's fixed size
  channel_order: RGB      # RGB | BGR, what the model was trained on
  scale: 0.00392156862745098  # 1/255: pixels to 0..1 before mean/std
  mean: [0.485, 0.456, 0.406] # per channel, in channel_order, after scale
  std: [0.229, 0.224, 0.225]
  softmax: auto           # auto | true | false
```

A sample is `(pixel * scale - mean) / std`, resized with bilinear interpolation to the
input size (aspect ratio not kept: use `crop` with `square: true` for that), in NCHW.
Every crop becomes one sample, submitted separately so the model's batcher can batch the
crops of all streams together. Output: `Classifications`, best first, one row per crop.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated, Any, Literal

import cv2
import numpy as np
from pydantic import Field

from pipelines.blocks.base import (
    OPTIONAL,
    BlockBuildError,
    BlockParams,
    BlockType,
    BuildContext,
    StepFactory,
    stateless,
)
from pipelines.decoders.base import describe, dim_is
from pipelines.models import ModelInfo
from pipelines.types import Classifications, Crops, FloatArray, Frame, Image

Channels = tuple[float, float, float]
FLOAT_INPUTS = ("float32", "float16")
SUM_TOLERANCE = 1e-3  # rows summing to 1 within this are already probabilities


class ClassifyParams(BlockParams):
    model: Annotated[str, Field(min_length=1)]
    top_k: Annotated[int, Field(ge=1, le=1000)] = 1
    input_size: tuple[Annotated[int, Field(ge=1)], Annotated[int, Field(ge=1)]] | None = None
    channel_order: Literal["RGB", "BGR"] = "RGB"
    scale: Annotated[float, Field(gt=0.0)] = 1.0 / 255.0
    mean: Channels = (0.0, 0.0, 0.0)
    std: tuple[
        Annotated[float, Field(gt=0)], Annotated[float, Field(gt=0)], Annotated[float, Field(gt=0)]
    ] = (1.0, 1.0, 1.0)
    softmax: Literal["auto"] | bool = "auto"
    timeout_s: Annotated[float, Field(gt=0)] = 30.0  # longest wait for the model's batcher


class ClassifyBlock(BlockType):
    type_name = "classify"
    description = "Classify crops (or the whole image) with an ONNX image classifier."
    Params = ClassifyParams
    inputs = {"image": ("image", "frame"), "crops": ("crops", OPTIONAL)}
    outputs = {"classes": "classes"}  # pipelines.types.Classifications
    wants_frame = True  # the stream id travels with each sample to the batcher

    @classmethod
    def build(cls, params: Any, ctx: BuildContext) -> StepFactory:
        p: ClassifyParams = params
        handle = ctx.model(p.model)
        prep = Preprocess(handle.info, p)
        top = TopK(handle.info, p)
        submit_many, timeout = handle.submit_many, p.timeout_s

        def classify(image: Image, crops: Crops | None, frame: Frame) -> Classifications:
            images = (image,) if crops is None else crops.images
            if not images:
                return top.empty
            stream = frame.stream_id
            futures = submit_many(list(prep.batch(images)), stream)
            return top(np.stack([f.result(timeout)[0] for f in futures]))

        return stateless(classify)


class Preprocess:
    """Images -> float NCHW samples, with the model's input checked once."""

    def __init__(self, info: ModelInfo, p: ClassifyParams) -> None:
        tensor = info.inputs[0] if len(info.inputs) == 1 else None
        shape = tensor.shape if tensor else ()
        if tensor is None or tensor.dtype not in FLOAT_INPUTS or len(shape) != 4:
            raise _model_error(info, "one input float32|float16 [N,3,H,W]", describe(info.inputs))
        if not dim_is(shape[1], 3):
            raise _model_error(info, "3 channels first (NCHW)", describe(info.inputs))
        self.size = _input_size(info, p.input_size, shape[3], shape[2])
        self.dtype = np.dtype(tensor.dtype)
        # (x * scale - mean) / std == x * gain + bias, per channel of the model's order;
        # frames are BGR, so for RGB models the constants are flipped instead of pixels.
        self.flip = p.channel_order == "RGB"
        order = slice(None, None, -1 if self.flip else 1)
        gain = (p.scale / np.asarray(p.std, np.float32))[order]
        bias = (-np.asarray(p.mean, np.float32) / np.asarray(p.std, np.float32))[order]
        # Repeated along a row (W x 3 values): numpy is ~30x slower broadcasting a
        # 3-vector over (..., 3) than over rows of W x 3.
        self.gain = np.tile(gain, self.size[0]).astype(np.float32)
        self.bias = np.tile(bias, self.size[0]).astype(np.float32)

    def batch(self, images: Sequence[Image]) -> np.ndarray[Any, Any]:
        """(N, 3, H, W) samples in the model's dtype and channel order."""
        (w, h), n = self.size, len(images)
        pixels = np.stack([cv2.resize(im, (w, h), interpolation=cv2.INTER_LINEAR) for im in images])
        x = pixels.reshape(n, h, w * 3).astype(np.float32)  # BGR rows
        x *= self.gain
        x += self.bias
        nhwc = x.reshape(n, h, w, 3)
        chw = (nhwc[..., ::-1] if self.flip else nhwc).transpose(0, 3, 1, 2)
        return np.ascontiguousarray(chw, dtype=self.dtype)


class TopK:
    """Model outputs (N, C) -> the k best classes per row, with the output checked once."""

    def __init__(self, info: ModelInfo, p: ClassifyParams) -> None:
        out = info.outputs[0] if info.outputs else None
        if out is None or len(out.shape) != 2:
            raise _model_error(info, "an output [N,C] (class scores)", describe(info.outputs))
        classes = out.shape[1]
        if isinstance(classes, int):
            if p.top_k > classes:
                raise BlockBuildError(
                    f"top_k {p.top_k} is more than model {info.id!r}'s {classes} classes",
                    "top_k",
                )
            if info.labels and len(info.labels) != classes:
                raise BlockBuildError(
                    f"model {info.id!r} has {len(info.labels)} labels but its output "
                    f"{describe([out])} has {classes} classes",
                    "model",
                )
        self.k, self.softmax = p.top_k, p.softmax
        self.labels = np.asarray(info.labels, dtype=object) if info.labels else None
        self.empty = Classifications(
            np.zeros((0, self.k), np.int64), np.zeros((0, self.k), np.float32)
        )

    def __call__(self, scores: FloatArray) -> Classifications:
        scores = scores.astype(np.float32, copy=False)
        if self.softmax is True or (self.softmax == "auto" and not _probabilities(scores)):
            scores = _softmax(scores)
        best = np.argsort(-scores, axis=1, kind="stable")[:, : self.k]
        conf = np.take_along_axis(scores, best, axis=1)
        names = () if self.labels is None else tuple(map(tuple, self.labels[best].tolist()))
        return Classifications(best.astype(np.int64), conf, names)


def _probabilities(scores: FloatArray) -> bool:
    """Rows already in 0..1 that sum to 1: the model ends with a softmax."""
    if scores.min() < 0.0 or scores.max() > 1.0:
        return False
    return bool(np.all(np.abs(scores.sum(axis=1) - 1.0) <= SUM_TOLERANCE))


def _softmax(scores: FloatArray) -> FloatArray:
    e = np.exp(scores - scores.max(axis=1, keepdims=True))  # shifted: no overflow
    probs: FloatArray = e / e.sum(axis=1, keepdims=True)
    return probs


def _input_size(
    info: ModelInfo, asked: tuple[int, int] | None, w: object, h: object
) -> tuple[int, int]:
    """(width, height): the block's input_size, else the model config's, else the model's
    fixed dims; an explicit size must agree with fixed dims."""
    fixed = (w, h) if isinstance(w, int) and isinstance(h, int) and w > 0 and h > 0 else None
    size = asked or info.input_size or fixed
    if size is None:
        raise BlockBuildError(
            f"model {info.id!r} has no fixed input size ({describe(info.inputs)}); "
            "set input_size: [width, height]",
            "input_size",
        )
    if fixed is not None and size != fixed:
        raise BlockBuildError(
            f"input_size {list(size)} does not match model {info.id!r}'s fixed input "
            f"{list(fixed)} (width, height)",
            "input_size",
        )
    return size


def _model_error(info: ModelInfo, expected: str, actual: str) -> BlockBuildError:
    return BlockBuildError(
        f"model {info.id!r}: block 'classify' expects {expected}; the model has {actual or 'none'}",
        "model",
    )
