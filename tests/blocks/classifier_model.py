"""A tiny real ONNX colour classifier, protobuf-encoded by hand (no `onnx` package).

Graph: image float32 [n,3,H,W] -> GlobalAveragePool -> Flatten -> MatMul(WEIGHTS) ->
logits [n,3]. With samples scaled to 0..1 in RGB order the pooled values are the mean
R, G, B, and the weights turn them into logits for red, green, blue: a saturated colour
wins by a wide margin, and the logits are outside 0..1 (so `softmax: auto` applies one).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from tests.support.models import _int, _msg, _str, _strs, _value_info

LABELS = ("red", "green", "blue")
# Row i: how much mean channel i adds to each class's logit (own class +4, others -2).
WEIGHTS = np.array([[4, -2, -2], [-2, 4, -2], [-2, -2, 4]], np.float32)
_FLOAT = 1  # onnx TensorProto.DataType.FLOAT


def classifier_model(
    size: tuple[int | str, int | str] = (32, 32),
    labels: Sequence[str] = LABELS,
    batch: int | str = "n",
) -> bytes:
    """The model's bytes; `size` is the input (width, height): ints fix it, strings make
    it symbolic. `labels` go into the metadata key "labels" (comma-separated)."""
    width, height = size
    nodes = (
        _node("GlobalAveragePool", ["image"], "pooled")
        + _node("Flatten", ["pooled"], "flat")
        + _node("MatMul", ["flat", "weights"], "logits")
    )
    graph = (
        nodes
        + _str(2, "colour_classifier")
        + _msg(5, _tensor("weights", WEIGHTS))  # initializer
        + _msg(11, _value_info("image", [batch, 3, height, width]))
        + _msg(12, _value_info("logits", [batch, len(WEIGHTS)]))
    )
    props = _msg(14, _str(1, "labels") + _str(2, ",".join(labels))) if labels else b""
    opset = _str(1, "") + _int(2, 13)
    return _int(1, 8) + _msg(8, opset) + _msg(7, graph) + props  # ir_version 8, opset 13


def _node(op: str, inputs: Sequence[str], output: str) -> bytes:
    """NodeProto: input (1), output (2), op_type (4)."""
    return _msg(1, _strs(1, inputs) + _str(2, output) + _str(4, op))


def _tensor(name: str, value: np.ndarray) -> bytes:
    """TensorProto: dims (1), data_type (2), name (8), raw_data (9, little-endian)."""
    dims = b"".join(_int(1, d) for d in value.shape)
    raw = value.astype("<f4").tobytes()
    return dims + _int(2, _FLOAT) + _str(8, name) + _msg(9, raw)
