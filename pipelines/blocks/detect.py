"""`detect`: run an object/face detector on an image and decode its boxes.

```yaml
- id: people
  type: detect
  model: person          # a model id from the config's `models:`
  image: frame           # optional; any image output
  confidence: 0.5
  nms_iou: 0.5
  classes: [person]      # optional: class names or ids to keep
  max_detections: 100
```
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated, Any

import numpy as np
from pydantic import Field

from pipelines.blocks.base import (
    BlockBuildError,
    BlockParams,
    BlockType,
    BuildContext,
    StepFactory,
    stateless,
)
from pipelines.decoders import build_decoder
from pipelines.decoders.base import DecodeOptions
from pipelines.models import ModelInfo, Tensor
from pipelines.shared_runs import SharedRuns
from pipelines.types import Detections, Frame, Image


class DetectParams(BlockParams):
    model: Annotated[str, Field(min_length=1)]
    confidence: Annotated[float, Field(ge=0.0, le=1.0)] = 0.5
    nms_iou: Annotated[float, Field(gt=0.0, le=1.0)] = 0.5
    max_detections: Annotated[int, Field(ge=1, le=10_000)] = 300
    classes: list[str | int] | None = None
    timeout_s: Annotated[float, Field(gt=0)] = 30.0  # longest wait for the model's batcher


class DetectBlock(BlockType):
    type_name = "detect"
    description = "Run a detection model (YOLO, TF-OD SSD, CenterFace) on an image."
    Params = DetectParams
    inputs = {"image": ("image", "frame")}
    outputs = {"detections": "detections"}
    wants_frame = True  # the stream id travels with each sample to the batcher

    @classmethod
    def build(cls, params: Any, ctx: BuildContext) -> StepFactory:
        p: DetectParams = params
        handle = ctx.model(p.model)
        info = handle.info
        if not info.decoder:
            raise BlockBuildError(
                f"model {p.model!r} declares no decoder; detect needs one "
                "(models.<id>.decoder: tf_od, yolo, centerface, ...)",
                "model",
            )
        decoder = build_decoder(info, DecodeOptions(p.confidence, p.nms_iou, p.max_detections))
        keep_ids, keep_names = _class_filter(info, p.classes)
        filtering = p.classes is not None
        preprocess, decode, submit, timeout = (
            decoder.preprocess,
            decoder.decode,
            handle.submit,
            p.timeout_s,
        )
        # The model's runs another workflow on the same frames may share (a shadow's).
        shared: SharedRuns | None = getattr(handle, "shared", None)

        def run(image: Image, frame: Frame) -> tuple[Sequence[Tensor], Any]:
            sample, transform = preprocess(image)
            return submit(sample, frame.stream_id).result(timeout), transform

        def detect(image: Image, frame: Frame) -> Detections:
            if shared is not None and frame.stream_id in shared.streams:
                key = (frame.stream_id, frame.seq, frame.capture_mono, id(image))
                outputs, transform = shared.run(key, lambda: run(image, frame), timeout)
            else:
                outputs, transform = run(image, frame)
            dets = decode(outputs, transform)
            if filtering and len(dets):
                mask = np.isin(dets.class_id, keep_ids)
                if keep_names and dets.class_name:
                    mask |= np.fromiter((n in keep_names for n in dets.class_name), bool, len(dets))
                dets = dets.select(mask)
            return dets

        return stateless(detect)


def _class_filter(
    info: ModelInfo, classes: list[str | int] | None
) -> tuple[np.ndarray[Any, Any], frozenset[str]]:
    """Class ids (matched on class_id) and names (matched on class_name), checked once."""
    ids = [c for c in classes or () if isinstance(c, int)]
    names = frozenset(c for c in classes or () if isinstance(c, str))
    unknown = sorted(names - set(info.labels))
    if unknown:
        known = ", ".join(info.labels) or "the model has no labels; use class ids"
        raise BlockBuildError(
            f"unknown class {unknown[0]!r} for model {info.id!r} ({known})", "classes"
        )
    return np.asarray(sorted(set(ids)), dtype=np.int64), names
