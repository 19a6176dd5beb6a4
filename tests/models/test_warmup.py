"""Warm-up at load: each batch size run once, seen in ONNX Runtime's own profile (which
records every run and its input shapes), skipped when the input's size is unknown."""

from __future__ import annotations

import dataclasses
import json
import logging
from pathlib import Path
from typing import Any

import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from appliance.config import AppConfig
from appliance.models import LoadedModel, ModelLoadError, load_model
from appliance.models.warmup import batch_sizes, image_dims, warm_up
from pipelines.spec import ModelSpec

CPU = "CPUExecutionProvider"


def relu_model(path: Path, dims: list[int | str], elem: int = TensorProto.FLOAT) -> Path:
    x = helper.make_tensor_value_info("x", elem, dims)
    y = helper.make_tensor_value_info("y", elem, dims)
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "relu", [x], [y])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(path))
    return path


def spec(path: Path, **fields: Any) -> ModelSpec:
    return ModelSpec.model_validate({"path": path, "providers": ["cpu"], **fields})


def profiled(model: LoadedModel, tmp_path: Path) -> LoadedModel:
    """The same model on a session that writes ORT's profile (runs, input shapes)."""
    options = ort.SessionOptions()
    options.enable_profiling = True
    options.profile_file_prefix = str(tmp_path / "warmup")
    session = ort.InferenceSession(model.info.path, options, providers=[CPU])
    return dataclasses.replace(model, session=session)


def runs_in_profile(model: LoadedModel) -> list[list[int]]:
    """The input shape of each run ORT recorded, in order."""
    events = json.loads(Path(model.session.end_profiling()).read_text())
    nodes = [e for e in events if e.get("cat") == "Node" and e["name"].endswith("_kernel_time")]
    return [e["args"]["input_type_shape"][0]["float"] for e in nodes]


def load(path: Path, tmp_path: Path, **fields: Any) -> LoadedModel:
    return load_model("m", spec(path, **fields), AppConfig(base_dir=tmp_path).resolve)


def test_each_batch_size_runs_once_largest_first(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = relu_model(tmp_path / "fixed.onnx", ["n", 3, 8, 8])
    cfg = spec(path, batching={"max_batch_size": 4}, session={"warmup": False})
    model = profiled(load(path, tmp_path, session={"warmup": False}), tmp_path)
    caplog.set_level(logging.INFO, logger="appliance.models")
    assert warm_up(model, cfg) == (4, 2, 1)
    assert runs_in_profile(model) == [[4, 3, 8, 8], [2, 3, 8, 8], [1, 3, 8, 8]]
    assert "model 'm': warmed up batch sizes 4, 2, 1 in " in caplog.text


def test_load_model_warms_up_when_told_and_on_a_gpu_by_default(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = relu_model(tmp_path / "fixed.onnx", [2, 3, 8, 8])  # a fixed batch of 2
    caplog.set_level(logging.INFO, logger="appliance.models")
    load(path, tmp_path, session={"warmup": True})
    assert "model 'm': warmed up batch sizes 2 in " in caplog.text
    caplog.clear()
    load(path, tmp_path, session={"warmup": False})
    assert "warmed up" not in caplog.text
    load(path, tmp_path)  # auto: on a GPU provider only, and this one runs on the CPU
    assert "warmed up" not in caplog.text


def test_a_dynamic_input_is_sized_from_input_size_or_skipped(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = relu_model(tmp_path / "dynamic.onnx", ["n", 3, "h", "w"])
    model = profiled(load(path, tmp_path, session={"warmup": False}), tmp_path)
    caplog.set_level(logging.DEBUG, logger="appliance.models")
    assert warm_up(model, spec(path, batching={"max_batch_size": 1})) == ()
    assert "model 'm': no warm-up: input x tensor(float)" in caplog.text
    sized = spec(path, input_size=[16, 8], batching={"max_batch_size": 1})
    assert warm_up(model, sized) == (1,)
    assert runs_in_profile(model) == [[1, 3, 8, 16]]  # NCHW: (3, height, width)


def test_a_failing_run_is_a_load_error_naming_model_and_batch(tmp_path: Path) -> None:
    # A reshape to one sample's 192 values: batch 1 runs, batch 2 fails inside the graph.
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 3, 8, 8])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 192])
    shape = helper.make_tensor("shape", TensorProto.INT64, [2], [1, 192])
    node = helper.make_node("Reshape", ["x", "shape"], ["y"])
    graph = helper.make_graph([node], "one", [x], [y], [shape])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    path = tmp_path / "one.onnx"
    onnx.save(model, str(path))
    with pytest.raises(ModelLoadError, match=r"^model 'm': warm-up with batch size 2 failed: "):
        load(path, tmp_path, batching={"max_batch_size": 2}, session={"warmup": True})


@pytest.mark.parametrize(
    ("shape", "size", "dims"),
    [
        ([1, 3, 640, 640], None, (3, 640, 640)),
        (["n", 3, "h", "w"], (320, 240), (3, 240, 320)),
        (["n", "h", "w", 3], (320, 240), (240, 320, 3)),
        (["n", "h", "w", "c"], (320, 240), None),
        (["n", 3, "h", "w"], None, None),
    ],
)
def test_image_dims_follow_the_channel_dim(
    shape: list[Any], size: tuple[int, int] | None, dims: tuple[int, ...] | None
) -> None:
    assert image_dims(shape, size) == dims


def test_batch_sizes_are_capped_at_powers_of_two() -> None:
    assert batch_sizes("n", 1) == (1,)
    assert batch_sizes("n", 6) == (6, 4, 2, 1)
    assert batch_sizes("n", 256) == (256, 128, 64, 32, 16, 8, 4, 2, 1)
    assert batch_sizes(8, 256) == (8,)
