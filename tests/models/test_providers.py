"""TensorRT and CUDA session options: ORT's option names, the checks at declaration, the
engine cache under the file policy, and the fallback to the CPU on this machine."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from appliance.config import AppConfig
from appliance.errors import FileAccessError
from appliance.models import ModelLoadError, load_model
from appliance.models.providers import (
    CUDA,
    TENSORRT,
    default_engine_cache,
    provider_entries,
    resolve_session_paths,
)
from appliance.policy.files import FilePolicy
from appliance.policy.limits import LimitsConfig
from pipelines.spec import ModelSpec
from tests.support.models import MODELS

CPU = "CPUExecutionProvider"
ALL = (TENSORRT, CUDA, CPU)


def spec(path: Path | str = MODELS / "person_ssdlite.onnx", **fields: Any) -> ModelSpec:
    return ModelSpec.model_validate({"path": path, "decoder": "tf_od", **fields})


def relu_model(path: Path, dims: list[int | str], *, qdq: bool = False) -> Path:
    """A one-node model (Relu, or a Quantize/Dequantize pair) with input `dims`."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, dims)
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, dims)
    if qdq:
        scale = helper.make_tensor("s", TensorProto.FLOAT, [], [0.1])
        zero = helper.make_tensor("z", TensorProto.INT8, [], [0])
        nodes = [
            helper.make_node("QuantizeLinear", ["x", "s", "z"], ["q"]),
            helper.make_node("DequantizeLinear", ["q", "s", "z"], ["y"]),
        ]
        graph = helper.make_graph(nodes, "qdq", [x], [y], [scale, zero])
    else:
        graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "relu", [x], [y])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(path))
    return path


def owner(base: Path) -> FilePolicy:
    return FilePolicy(base, LimitsConfig())


def test_tensorrt_and_cuda_get_ort_option_names() -> None:
    session = spec(
        providers=["tensorrt", "cuda", "cpu"],
        session={
            "tensorrt": {"engine_cache": "/var/cache/trt", "fp16": True, "workspace_mb": 2048},
            "cuda": {"device_id": 1, "graphs": True},
        },
    ).session
    trt, cuda, cpu = provider_entries(ALL, session)
    assert trt == (
        TENSORRT,
        {
            "device_id": "1",
            "trt_engine_cache_enable": "1",
            "trt_engine_cache_path": "/var/cache/trt",
            "trt_timing_cache_enable": "1",
            "trt_timing_cache_path": "/var/cache/trt",
            "trt_fp16_enable": "1",
            "trt_int8_enable": "0",
            "trt_max_workspace_size": str(2048 * 1024 * 1024),
        },
    )
    assert cuda == (CUDA, {"device_id": "1", "enable_cuda_graph": "1"})
    assert cpu == CPU


def test_engines_go_to_the_users_cache_folder_by_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", "/srv/cache")
    assert default_engine_cache() == Path("/srv/cache/appliance/tensorrt")
    (trt,) = provider_entries([TENSORRT], spec().session)
    assert isinstance(trt, tuple)
    assert trt[1]["trt_engine_cache_path"] == "/srv/cache/appliance/tensorrt"
    assert "trt_max_workspace_size" not in trt[1]  # TensorRT's own default


def test_tensorrt_with_options_loads_on_the_cpu_here_with_one_warning(
    caplog: pytest.LogCaptureFixture, tmp_path: Path
) -> None:
    cfg = spec(
        providers=["tensorrt", "cuda", "cpu"],
        session={
            "tensorrt": {"engine_cache": str(tmp_path / "engines"), "fp16": True},
            "cuda": {"device_id": 0},
        },
    )
    caplog.set_level(logging.INFO, logger="appliance.models")
    model = load_model("person", cfg, AppConfig(base_dir=tmp_path).resolve)
    if model.info.providers[0] != CPU:
        pytest.skip("a GPU provider works on this machine: nothing falls back")
    warnings = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1, [r.getMessage() for r in warnings]
    assert "model 'person': asked for tensorrt, running on " + CPU in warnings[0].getMessage()
    out = model.session.run(None, {model.input_name: np.zeros((1, 64, 64, 3), np.uint8)})
    assert len(out) == 4


@pytest.mark.parametrize(
    ("fields", "says"),
    [
        (
            {"providers": ["cuda", "cpu"], "session": {"tensorrt": {"fp16": True}}},
            "models.m.session.tensorrt: TensorRT options, but `providers` (cuda, cpu) does "
            "not ask for tensorrt",
        ),
        (
            {"providers": ["cpu"], "session": {"cuda": {"graphs": True}}},
            "models.m.session.cuda: CUDA options, but `providers` (cpu) asks for neither",
        ),
    ],
)
def test_options_for_a_provider_not_asked_for_are_refused(
    fields: dict[str, Any], says: str, tmp_path: Path
) -> None:
    with pytest.raises(ModelLoadError, match="^" + says.replace("(", r"\(").replace(")", r"\)")):
        resolve_session_paths(spec(**fields), owner(tmp_path), "models.m")


def test_cuda_options_serve_tensorrt_too(tmp_path: Path) -> None:
    cfg = spec(providers=["tensorrt", "cpu"], session={"cuda": {"device_id": 1}})
    assert resolve_session_paths(cfg, owner(tmp_path), "models.m") == cfg


def test_cuda_graphs_need_a_fixed_input(tmp_path: Path) -> None:
    dynamic = relu_model(tmp_path / "dynamic.onnx", [1, 3, "h", "w"])
    graphs = {"providers": ["cuda", "cpu"], "session": {"cuda": {"graphs": True}}}
    with pytest.raises(ModelLoadError) as caught:
        resolve_session_paths(spec(dynamic, **graphs), owner(tmp_path), "models.m")
    assert str(caught.value).startswith(
        "models.m.session.cuda.graphs: the model's input size is not fixed ([1, 3, ?, ?]) "
        "and no input_size is configured"
    )
    sized = spec(dynamic, input_size=[64, 32], **graphs)
    assert resolve_session_paths(sized, owner(tmp_path), "models.m") == sized


def test_cuda_graphs_with_a_free_batch_dim_need_batches_of_one(tmp_path: Path) -> None:
    free_batch = relu_model(tmp_path / "batch.onnx", ["n", 3, 8, 8])
    graphs = {"providers": ["cuda"], "session": {"cuda": {"graphs": True}}}
    with pytest.raises(
        ModelLoadError, match=r"^models\.m\.session\.cuda\.graphs: batches of 1 to 4"
    ):
        resolve_session_paths(spec(free_batch, **graphs), owner(tmp_path), "models.m")
    one = spec(free_batch, batching={"max_batch_size": 1}, **graphs)
    assert resolve_session_paths(one, owner(tmp_path), "models.m") == one


def test_int8_needs_a_quantized_model(tmp_path: Path) -> None:
    plain = relu_model(tmp_path / "plain.onnx", [1, 3, 8, 8])
    int8 = {"providers": ["tensorrt"], "session": {"tensorrt": {"int8": True}}}
    with pytest.raises(
        ModelLoadError, match=r"^models\.m\.session\.tensorrt\.int8: the model has no Q"
    ):
        resolve_session_paths(spec(plain, **int8), owner(tmp_path), "models.m")
    quantized = spec(relu_model(tmp_path / "qdq.onnx", [1, 3, 8, 8], qdq=True), **int8)
    assert resolve_session_paths(quantized, owner(tmp_path), "models.m") == quantized


def test_the_engine_cache_is_made_absolute_and_kept_under_the_roots(tmp_path: Path) -> None:
    cfg = spec(providers=["tensorrt"], session={"tensorrt": {"engine_cache": "engines"}})
    resolved = resolve_session_paths(cfg, owner(tmp_path), "models.m")
    assert resolved.session.tensorrt.engine_cache == tmp_path / "engines"
    assert resolved.session.tensorrt.fp16 is False  # the rest as it was

    roots = FilePolicy(tmp_path, LimitsConfig(), roots=(tmp_path / "models",))
    outside = spec(providers=["tensorrt"], session={"tensorrt": {"engine_cache": "/tmp/x"}})
    with pytest.raises(FileAccessError) as caught:
        resolve_session_paths(outside, roots, "models.m")
    assert caught.value.where == "models.m.session.tensorrt.engine_cache"
    assert "outside the file roots" in str(caught.value)

    (tmp_path / "a_file").write_text("")
    a_file = spec(providers=["tensorrt"], session={"tensorrt": {"engine_cache": "a_file"}})
    with pytest.raises(FileAccessError, match="not a folder"):
        resolve_session_paths(a_file, owner(tmp_path), "models.m")


def test_without_options_the_spec_is_unchanged(tmp_path: Path) -> None:
    cfg = spec(providers=["cpu"])
    assert resolve_session_paths(cfg, owner(tmp_path), "models.m") is cfg
