"""The one interface every model output format implements.

A decoder is built once per detect block at compile time (where it checks the model's
declared inputs and outputs and raises `DecoderError` naming what does not match), then
per frame turns a BGR image into the model's input sample and the model's outputs back
into `Detections` in the frame's pixel coordinates.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from pipelines.models import ModelInfo, Tensor
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
