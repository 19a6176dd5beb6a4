"""What a workflow needs from a model: its declared interface and a way to run one sample.

The runtime (`appliance.models`) implements `ModelHandle` with a shared ONNX Runtime
session behind a dynamic batcher; tests and benchmarks may implement it directly.
`pipelines/` never imports onnxruntime itself.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

import numpy as np
import numpy.typing as npt

if TYPE_CHECKING:  # pipelines.decoders imports this module
    from pipelines.decoders.prologue import Prologue

Dim = int | str | None  # ONNX dims: fixed int, symbolic name, or unknown


@dataclass(frozen=True, slots=True)
class TensorInfo:
    """One graph input or output as the ONNX model declares it."""

    name: str
    shape: tuple[Dim, ...]
    dtype: str  # numpy dtype name: "uint8", "float32", ...

    @property
    def fixed_batch(self) -> int | None:
        """The batch dimension when the model fixes it (e.g. 1), else None."""
        first = self.shape[0] if self.shape else None
        return first if isinstance(first, int) and first > 0 else None


@dataclass(frozen=True, slots=True)
class ModelInfo:
    """A loaded model as a workflow sees it.

    `decoder` names the output format (`tf_od`, `yolo`, `centerface`); `labels` are class
    names by class id; `input_size` is the (width, height) the preprocessor resizes to,
    or None to use the model's fixed size (or the frame size for fully dynamic models).

    `inputs` always describe the model file's own input. `prologue` is set when the
    runtime composed the decoder's pixel preprocessing into the session's graph: the
    session then takes the geometry's BGR uint8 [N,H,W,3] images, and the decoder's
    `preprocess` returns those instead of float planes.
    """

    id: str
    path: str
    inputs: tuple[TensorInfo, ...]
    outputs: tuple[TensorInfo, ...]
    decoder: str
    labels: tuple[str, ...] = ()
    input_size: tuple[int, int] | None = None
    metadata: Mapping[str, str] = field(default_factory=dict)
    providers: tuple[str, ...] = ()
    prologue: Prologue | None = None

    @property
    def input(self) -> TensorInfo:
        return self.inputs[0]


Tensor = npt.NDArray[np.generic]


class ModelHandle(Protocol):
    """A model shared by many streams.

    `submit` takes one sample *without* the batch dimension and returns a future of the
    model's outputs for that sample, also without the batch dimension. Samples submitted
    close together from different threads may be run as one batch.
    """

    @property
    def info(self) -> ModelInfo: ...

    def submit(self, sample: Tensor, stream_id: str = "") -> Future[Sequence[Tensor]]: ...

    def submit_many(
        self, samples: Sequence[Tensor], stream_id: str = ""
    ) -> list[Future[Sequence[Tensor]]]:
        """Several samples of one frame (crops), queued together: one batch if they fit."""
        ...
