"""`crop`: cut each detected box out of an image, e.g. faces for a classifier.

```yaml
- id: face_crops
  type: crop
  image: frame            # optional; any image output
  detections: faces       # detections or tracks
  padding: 0.1            # 10 % of the box's width/height on every side
  padding_px: 0           # plus this many pixels on every side
  min_size: 16            # skip crops narrower or shorter than 16 px
  square: true            # grow to a square (classifiers expect undistorted input)
  max_crops: 8            # keep the 8 most confident
```

The crops are views into the image, not copies: cutting costs one slice per box, and
blocks never write into their inputs.
"""

from __future__ import annotations

import dataclasses
from typing import Annotated, Any

import numpy as np
from pydantic import Field

from pipelines.blocks._boxes import PaddedBoxParams, box_sizes, pixel_boxes
from pipelines.blocks.base import BlockType, BuildContext, StepFactory, stateless
from pipelines.types import Crops, Detections, Image

EMPTY = Crops(images=(), detections=Detections.empty())


class CropParams(PaddedBoxParams):
    min_size: Annotated[int, Field(ge=1, le=10_000)] = 1  # px, both sides of the final crop
    square: bool = False
    max_crops: Annotated[int, Field(ge=1, le=10_000)] | None = None  # most confident first


class CropBlock(BlockType):
    type_name = "crop"
    description = "Cut detected boxes (padded, optionally square) out of an image."
    Params = CropParams
    inputs = {"image": ("image", "frame"), "detections": ("detections", None)}
    outputs = {"crops": "crops"}

    @classmethod
    def build(cls, params: Any, ctx: BuildContext) -> StepFactory:
        p: CropParams = params
        padding, padding_px, square = p.padding, p.padding_px, p.square
        min_size, max_crops = p.min_size, p.max_crops

        def crop(image: Image, detections: Detections) -> Crops:
            if not len(detections):
                return EMPTY
            height, width = image.shape[:2]
            boxes = pixel_boxes(detections.xyxy, width, height, padding, padding_px, square)
            w, h = box_sizes(boxes)
            keep = np.flatnonzero((w >= min_size) & (h >= min_size))
            if max_crops is not None and len(keep) > max_crops:
                # The most confident, in their original order (stable for tracks).
                best = np.argsort(-detections.confidence[keep], kind="stable")[:max_crops]
                keep = np.sort(keep[best])
            if not len(keep):
                return EMPTY
            kept = boxes[keep]
            images = tuple(image[y1:y2, x1:x2] for x1, y1, x2, y2 in kept.tolist())
            cut = dataclasses.replace(detections.select(keep), xyxy=kept.astype(np.float32))
            return Crops(images=images, detections=cut)

        return stateless(crop)
