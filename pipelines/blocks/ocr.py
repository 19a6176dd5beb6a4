"""`ocr`: read the text in image crops with a CTC recogniser (PaddleOCR PP-OCR rec).

```yaml
- id: read
  type: ocr
  crops: lines            # a `crops` output, e.g. a crop block over text detections
  model: text_rec         # a recogniser: input [N,3,48,W], output [N,T,C] softmax
  min_confidence: 0.5     # drop readings whose mean character probability is lower
  max_width: 320          # px: recogniser input width every crop is fitted into
```

Each crop is resized to the model's height (48 px unless the model fixes another) keeping
its aspect ratio, at most `max_width` px wide (a longer line is squeezed), then padded on
the right to exactly `max_width`: every sample has one shape, so all crops of all streams
batch together in the model's batcher. Pixels are scaled to [-1, 1] as (x / 255 - 0.5) /
0.5 and the padding is 0 (mid-grey), as PaddleOCR's `resize_norm_img` does; channels stay
in the frame's BGR order, as in PaddleOCR (cv2 images throughout; RGB read the same on
our tests). Decoding is greedy CTC (PaddleOCR's `CTCLabelDecode`): the best class per
time step, repeats collapsed, blanks (index 0) dropped; the symbols are the model's
metadata key `character` (one per line) plus a space when the model has one class more
(PaddleOCR's `use_space_char`). The confidence is the mean probability of the kept
characters; leading and trailing spaces are stripped from the text, and a crop in which
nothing was read gives no row.
"""

from __future__ import annotations

import math
from typing import Annotated, Any

import cv2
import numpy as np
import numpy.typing as npt
from pydantic import Field

from pipelines.blocks.base import (
    BlockBuildError,
    BlockParams,
    BlockType,
    BuildContext,
    StepFactory,
    stateless,
)
from pipelines.decoders.base import describe, dim_is
from pipelines.models import ModelInfo, Tensor
from pipelines.types import Crops, Detections, FloatArray, Frame, Image, Texts

DEFAULT_HEIGHT = 48  # px: PP-OCRv3/v4 rec input height (rec_image_shape 3,48,320)
BLANK = 0  # CTC blank class index (PaddleOCR CTCLabelDecode)
SYMBOLS_KEY = "character"  # model metadata key: the symbol list, newline-separated
_PIXEL_SCALE = 1.0 / 127.5  # (x / 255 - 0.5) / 0.5 == x / 127.5 - 1


class OcrParams(BlockParams):
    model: Annotated[str, Field(min_length=1)]
    min_confidence: Annotated[float, Field(ge=0.0, le=1.0)] = 0.5
    max_width: Annotated[int, Field(ge=16, le=4096)] = 320  # px, recogniser input width
    timeout_s: Annotated[float, Field(gt=0)] = 30.0  # longest wait for the model's batcher


class OcrBlock(BlockType):
    type_name = "ocr"
    description = "Read the text in image crops with a CTC text recogniser (PP-OCR rec)."
    Params = OcrParams
    inputs = {"crops": ("crops", None)}
    outputs = {"text": "text"}
    wants_frame = True  # the stream id travels with each sample to the batcher

    @classmethod
    def build(cls, params: Any, ctx: BuildContext) -> StepFactory:
        p: OcrParams = params
        handle = ctx.model(p.model)
        info = handle.info
        reader = CtcReader(info, p.max_width)
        submit_many, timeout, min_conf = handle.submit_many, p.timeout_s, p.min_confidence

        def ocr(crops: Crops, frame: Frame) -> Texts:
            futures = submit_many([reader.sample(image) for image in crops.images], frame.stream_id)
            if not futures:
                return _NO_TEXT
            text, conf = reader.decode(np.stack([f.result(timeout)[0] for f in futures]))
            read = np.fromiter(map(bool, text), bool, len(text))  # nothing read: no row
            keep = np.flatnonzero(read & (conf >= min_conf))
            return Texts(tuple(text[i] for i in keep), conf[keep], crops.detections.select(keep))

        return stateless(ocr)


class CtcReader:
    """Crop -> recogniser sample, and recogniser output -> text, for one model."""

    def __init__(self, info: ModelInfo, max_width: int) -> None:
        classes = _check_output(info)
        self.height, self.width = _input_size(info, max_width)
        self.symbols = _symbols(info, classes)

    def sample(self, image: Image) -> Tensor:
        """BGR crop -> float32 [3, height, width]: resized, scaled to [-1, 1], padded."""
        sample = np.zeros((3, self.height, self.width), np.float32)  # 0: mid-grey padding
        h, w = image.shape[:2]
        if h == 0 or w == 0:
            return sample  # reads as nothing, dropped by min_confidence
        width = min(self.width, max(1, math.ceil(self.height * w / h)))
        resized = cv2.resize(image, (width, self.height), interpolation=cv2.INTER_LINEAR)
        planes = sample[:, :, :width]
        planes[...] = resized.transpose(2, 0, 1)
        planes *= _PIXEL_SCALE
        planes -= 1.0
        return sample

    def decode(self, probs: FloatArray) -> tuple[list[str], FloatArray]:
        """Greedy CTC over (N, T, C) probabilities -> N texts and mean probabilities."""
        best = probs.argmax(-1)  # (N, T) class per time step
        score = np.take_along_axis(probs, best[..., None], -1)[..., 0]
        keep = best != BLANK
        keep[:, 1:] &= best[:, 1:] != best[:, :-1]  # a repeat is one character
        count = keep.sum(1)
        conf = np.where(count > 0, (score * keep).sum(1) / np.maximum(count, 1), 0.0)
        text = ["".join(self.symbols[row[k]]).strip() for row, k in zip(best, keep, strict=True)]
        return text, conf.astype(np.float32)


_NO_TEXT = Texts((), np.zeros((0,), np.float32), Detections.empty())


def _check_output(info: ModelInfo) -> int:
    """One output [N,T,C] with a fixed class count C; returns C."""
    outputs = info.outputs
    if len(outputs) == 1 and len(outputs[0].shape) == 3:
        classes = outputs[0].shape[2]
        if isinstance(classes, int) and classes > 1:
            return classes
    raise _model_error(
        info,
        "one output [N,T,C] (per-time-step class probabilities, C fixed)",
        describe(outputs) or "no outputs",
    )


def _input_size(info: ModelInfo, max_width: int) -> tuple[int, int]:
    """(height, width) of the samples: the model's fixed dims, else 48 and max_width."""
    inputs = info.inputs
    shape = inputs[0].shape if len(inputs) == 1 else ()
    if len(shape) != 4 or inputs[0].dtype != "float32" or not dim_is(shape[1], 3):
        raise _model_error(info, "one input float32 [N,3,H,W]", describe(inputs) or "no inputs")
    height = shape[2] if isinstance(shape[2], int) and shape[2] > 0 else DEFAULT_HEIGHT
    width = shape[3]
    if isinstance(width, int) and width > 0 and width != max_width:
        raise BlockBuildError(
            f"model {info.id!r} has a fixed input width of {width} px; set max_width: {width} "
            f"(got {max_width})",
            "max_width",
        )
    return height, max_width


def _symbols(info: ModelInfo, classes: int) -> npt.NDArray[np.str_]:
    """The class -> symbol table: blank, the metadata symbols, a space if C has room."""
    text = info.metadata.get(SYMBOLS_KEY)
    if not text:
        raise BlockBuildError(
            f"model {info.id!r} has no {SYMBOLS_KEY!r} metadata (the CTC symbol list, one "
            "per line, as PaddleOCR exports carry it); metadata keys: "
            f"{', '.join(sorted(info.metadata)) or 'none'}",
            "model",
        )
    chars = text.split("\n")  # not splitlines(): symbols such as U+2028 are characters
    if classes == len(chars) + 2:
        chars.append(" ")  # PaddleOCR use_space_char
    elif classes != len(chars) + 1:
        raise BlockBuildError(
            f"model {info.id!r}: metadata {SYMBOLS_KEY!r} has {len(chars)} symbols, but the "
            f"output has {classes} classes, which needs {classes - 1} symbols (+ blank) "
            f"or {classes - 2} (+ blank and space)",
            "model",
        )
    return np.array(["", *chars], dtype=np.str_)


def _model_error(info: ModelInfo, expected: str, actual: str) -> BlockBuildError:
    return BlockBuildError(
        f"model {info.id!r}: block 'ocr' expects {expected}; the model has {actual}", "model"
    )
