"""Near-free ONNX models with a real model's inputs and outputs, made at bench time: the
appliance's own per-frame work (decoding, tracking, counting, drawing, the watch's
recorders) measured without a model's weight hiding it.

`free_tf_od` stands in for configs/models/person_ssdlite.onnx: the same input
(`image_tensor:0`, uint8 [N, H, W, 3]) and outputs (`detection_boxes:0` [N, K, 4],
`detection_scores:0` and `detection_classes:0` [N, K], `num_detections:0` [N]), so the
tf_od decoder runs on real-shaped outputs. It answers the same PEOPLE detections for
every image of the batch, its work a Shape and four Tiles: a few µs.
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
    graph = helper.make_graph(
        nodes,
        "free_tf_od",
        [image],
        outputs,
        [numpy_helper.from_array(v, k) for k, v in constants.items()],
    )
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", OPSET)], ir_version=IR_VERSION
    )
    onnx.checker.check_model(model)
    path.write_bytes(model.SerializeToString())
    return path
