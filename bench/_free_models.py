"""Near-free ONNX models with a real model's inputs and outputs, made at bench time: the
appliance's own per-frame work (decoding, tracking, counting, drawing, the watch's
recorders) measured without a model's weight hiding it.

`free_tf_od` stands in for configs/models/person_ssdlite.onnx: the same input
(`image_tensor:0`, uint8 [N, H, W, 3]) and outputs (`detection_boxes:0` [N, K, 4],
`detection_scores:0` and `detection_classes:0` [N, K], `num_detections:0` [N]), so the
tf_od decoder runs on real-shaped outputs. It answers the same PEOPLE detections for
every image of the batch, its work a Shape and four Tiles: a few µs.

`free_centerface` stands in for configs/models/centerface.onnx: input `input.1` float32
[N, 3, H, W], outputs heatmap [N, 1, h, w], scale [N, 2, h, w], offset [N, 2, h, w] and
landmarks [N, 10, h, w] at stride 4 (h = H / 4), so the centerface decoder runs on maps of
the real size. The maps are constants up to 1920x1088 input, sliced to the input's size
and tiled over the batch: FACES are peaks in the heatmap's top-left, the same for every
image. Its work is a copy of the maps: about 15 floats per output cell.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from appliance.watch.probe_model import IR_VERSION, OPSET

K = 10  # detection rows, as a TF-OD export pads to its max
# Three people standing in the frame, [ymin, xmin, ymax, xmax] normalised; the other rows
# score 0 (below any confidence), as an export's padding does.
PEOPLE = [[0.20, 0.10, 0.80, 0.25], [0.25, 0.40, 0.90, 0.55], [0.15, 0.70, 0.70, 0.85]]
PERSON = 1.0  # TF-OD's 1-based class id of a person


STRIDE = 4  # CenterFace's input pixels per output cell
MAX_HW = (1088, 1920)  # the largest input the stand-in answers (1080p padded to 32)
# (row, column, height px, width px) of three faces in heatmap cells and input pixels.
FACES = [(20, 30, 48, 40), (25, 80, 56, 44), (30, 130, 40, 32)]


def free_tf_od(path: Path) -> Path:
    """Write the stand-in for a TF-OD SSD detector at `path` (checked by onnx)."""
    boxes = np.zeros((1, K, 4), np.float32)
    boxes[0, : len(PEOPLE)] = PEOPLE
    scores = np.zeros((1, K), np.float32)
    scores[0, : len(PEOPLE)] = 0.9
    constants: dict[str, np.ndarray[Any, Any]] = {
        "boxes": boxes,
        "scores": scores,
        "classes": np.full((1, K), PERSON, np.float32),
        "count": np.array([float(K)], np.float32),
        "start": np.array([0], np.int64),
        "one": np.array([1], np.int64),
    }
    nodes = [
        helper.make_node("Shape", ["image_tensor:0"], ["shape"]),
        helper.make_node("Slice", ["shape", "start", "one"], ["n"]),  # the batch size
        helper.make_node("Concat", ["n", "one", "one"], ["reps3"], axis=0),
        helper.make_node("Concat", ["n", "one"], ["reps2"], axis=0),
        helper.make_node("Tile", ["boxes", "reps3"], ["detection_boxes:0"]),
        helper.make_node("Tile", ["scores", "reps2"], ["detection_scores:0"]),
        helper.make_node("Tile", ["classes", "reps2"], ["detection_classes:0"]),
        helper.make_node("Tile", ["count", "n"], ["num_detections:0"]),
    ]
    outputs = [
        helper.make_tensor_value_info("num_detections:0", TensorProto.FLOAT, ["N"]),
        helper.make_tensor_value_info("detection_boxes:0", TensorProto.FLOAT, ["N", K, 4]),
        helper.make_tensor_value_info("detection_scores:0", TensorProto.FLOAT, ["N", K]),
        helper.make_tensor_value_info("detection_classes:0", TensorProto.FLOAT, ["N", K]),
    ]
    image = helper.make_tensor_value_info("image_tensor:0", TensorProto.UINT8, ["N", "H", "W", 3])
    return _write(path, nodes, "free_tf_od", [image], outputs, constants)


def free_centerface(path: Path) -> Path:
    """Write the stand-in for CenterFace at `path` (checked by onnx)."""
    h, w = MAX_HW[0] // STRIDE, MAX_HW[1] // STRIDE
    heatmap = np.zeros((1, 1, h, w), np.float32)
    scale = np.zeros((1, 2, h, w), np.float32)
    offset = np.zeros((1, 2, h, w), np.float32)
    marks = np.zeros((1, 10, h, w), np.float32)
    for row, col, height, width in FACES:
        heatmap[0, 0, row, col] = 0.9
        scale[0, :, row, col] = np.log([height / STRIDE, width / STRIDE])
        # Landmarks as fractions of the box (y, x per point): eyes, nose, mouth corners.
        marks[0, :, row, col] = [0.35, 0.3, 0.35, 0.7, 0.55, 0.5, 0.75, 0.35, 0.75, 0.65]
    maps = {"heatmap": heatmap, "scale": scale, "offset": offset, "marks": marks}
    constants: dict[str, np.ndarray[Any, Any]] = {
        **maps,
        "hw_index": np.array([2, 3], np.int64),
        "stride": np.array([STRIDE], np.int64),
        "zeros": np.array([0, 0], np.int64),
        "axes": np.array([2, 3], np.int64),
        "start": np.array([0], np.int64),
        "one": np.array([1], np.int64),
        "ones3": np.array([1, 1, 1], np.int64),
    }
    names = ("537", "538", "539", "540")  # the real export's output names
    nodes = [
        helper.make_node("Shape", ["input.1"], ["shape"]),
        helper.make_node("Slice", ["shape", "start", "one"], ["n"]),  # the batch size
        helper.make_node("Gather", ["shape", "hw_index"], ["hw"]),
        helper.make_node("Div", ["hw", "stride"], ["cells"]),  # integer division
        helper.make_node("Concat", ["n", "ones3"], ["reps"], axis=0),
    ]
    for key, name in zip(maps, names, strict=True):
        nodes += [
            helper.make_node("Slice", [key, "zeros", "cells", "axes"], [f"{key}_cut"]),
            helper.make_node("Tile", [f"{key}_cut", "reps"], [name]),
        ]
    outputs = [
        helper.make_tensor_value_info(name, TensorProto.FLOAT, ["N", c, "h", "w"])
        for name, c in zip(names, (1, 2, 2, 10), strict=True)
    ]
    image = helper.make_tensor_value_info("input.1", TensorProto.FLOAT, ["N", 3, "H", "W"])
    return _write(path, nodes, "free_centerface", [image], outputs, constants)


def _write(
    path: Path,
    nodes: list[onnx.NodeProto],
    name: str,
    inputs: list[onnx.ValueInfoProto],
    outputs: list[onnx.ValueInfoProto],
    constants: dict[str, np.ndarray[Any, Any]],
) -> Path:
    graph = helper.make_graph(
        nodes, name, inputs, outputs, [numpy_helper.from_array(v, k) for k, v in constants.items()]
    )
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", OPSET)], ir_version=IR_VERSION
    )
    onnx.checker.check_model(model)
    path.write_bytes(model.SerializeToString())
    return path
