"""A decoder's pixel preprocessing as data, so the runtime can move it into the model graph.

Each decoder's host path turns the geometry's BGR uint8 HxWx3 image into the model's
input: channel order, a cast, a per-channel affine (scale, then offset) and a layout. A
`Prologue` states exactly that, once per model at load time; the runtime
(`appliance.models.prologue`) prepends it to the ONNX graph, and the session then takes
the geometry's uint8 [N,H,W,3] BGR images as they are. What the graph computes is what
`planar_rgb` and the DBNet normalisation compute in numpy: per element
`float32(x) * float32(scale[c]) + float32(offset[c])`, with the multiply skipped when
every scale is 1 and the add when every offset is 0, so both paths agree bit for bit.

Geometry (resize, letterbox) stays on the host, except the bottom/right zero padding up to
a multiple of `pad_multiple` (CenterFace at the frame's own size): in the graph it costs
the worker thread nothing, where the host would copy the whole frame to add 4 rows.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

PrologueDtype = Literal["float32", "float16", "uint8"]
PrologueLayout = Literal["NCHW", "NHWC"]
Triple = tuple[float, float, float]
_ONES: Triple = (1.0, 1.0, 1.0)
_ZEROS: Triple = (0.0, 0.0, 0.0)


@dataclass(frozen=True, slots=True)
class Prologue:
    """BGR uint8 [N,H,W,3] -> the model's input, as one decoder's host path computes it.

    `scale` and `offset` are per output channel (after any reversal), in the units of the
    cast pixel values: ImageNet normalisation (x / 255 - mean) / std is
    scale = 1 / (255 * std), offset = -mean / std. They are float32 values (the host path
    multiplies in float32), so `repr` of a prologue is a stable cache key.
    """

    dtype: PrologueDtype
    layout: PrologueLayout
    reverse_channels: bool = False  # BGR -> RGB
    scale: Triple = _ONES
    offset: Triple = _ZEROS
    pad_multiple: int = 1  # zero-pad bottom/right up to multiples of this (1: none)

    def __post_init__(self) -> None:
        if self.dtype == "uint8" and (self.scale != _ONES or self.offset != _ZEROS):
            raise ValueError("a uint8 prologue cannot scale or offset pixel values")
        if self.pad_multiple < 1:
            raise ValueError(f"pad_multiple must be at least 1, not {self.pad_multiple}")

    @property
    def scales(self) -> bool:
        """Whether the graph multiplies (False: every scale is 1)."""
        return self.scale != _ONES

    @property
    def offsets(self) -> bool:
        """Whether the graph adds an offset (False: every offset is 0)."""
        return self.offset != _ZEROS
