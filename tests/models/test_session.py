"""load_model against real ONNX files and the real ONNX Runtime of this machine."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest

from appliance.config import AppConfig
from appliance.models import LoadedModel, ModelLoadError, load_model
from appliance.models.session import labels_from_metadata, requested_providers
from pipelines.spec import ModelSpec, SessionSpec
from tests.support.models import MODELS

CPU = "CPUExecutionProvider"
CONFIGS = MODELS.parent  # the directory a config file would live in


def _load(model_id: str, path: Path | str, **fields: object) -> LoadedModel:
    cfg = ModelSpec.model_validate({"path": path, "decoder": "tf_od", **fields})
    return load_model(model_id, cfg, AppConfig(base_dir=CONFIGS).resolve)


def _warnings(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [
        r for r in caplog.records if r.name == "appliance.models" and r.levelno >= logging.WARNING
    ]


def test_loads_person_model_relative_to_config_dir(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="appliance.models")
    model = _load("person", "models/person_ssdlite.onnx", providers=["cpu"], labels=["person"])

    info = model.info
    assert info.id == model.id == "person"
    assert info.path == str(MODELS / "person_ssdlite.onnx")
    assert model.input_name == info.input.name == "image_tensor:0"
    assert info.input.dtype == "uint8"
    assert len(info.input.shape) == 4 and info.input.shape[3] == 3
    assert info.input.fixed_batch is None
    assert model.output_names == (
        "num_detections:0",
        "detection_boxes:0",
        "detection_scores:0",
        "detection_classes:0",
    )
    assert all(o.dtype == "float32" for o in info.outputs)
    assert info.labels == ("person",)
    assert info.decoder == "tf_od"
    assert info.providers == (CPU,) == model.requested_providers
    assert not _warnings(caplog)
    assert any(CPU in r.getMessage() and r.levelno == logging.INFO for r in caplog.records)


def test_yolo_export_labels_and_fixed_batch_from_the_model(yolov8_fixed_batch_model: Path) -> None:
    model = _load("fall", yolov8_fixed_batch_model, decoder="yolo", providers=["cpu"])

    info = model.info
    assert info.labels == ("Normal", "Fall")
    assert (info.input.name, info.input.shape, info.input.dtype) == (
        "images",
        (1, 3, 640, 640),
        "float32",
    )
    assert info.input.fixed_batch == 1
    assert [(o.name, o.shape) for o in info.outputs] == [("output0", (1, 6, 8400))]
    assert info.metadata["task"] == "detect"


def test_config_labels_win_over_labels_file_and_metadata(tmp_path: Path) -> None:
    labels_file = tmp_path / "labels.txt"
    labels_file.write_text("cat\n\n  dog  \n\n", encoding="utf-8")

    from_file = _load(
        "pets", "models/person_ssdlite.onnx", providers=["cpu"], labels_file=labels_file
    )
    both = _load(
        "pets",
        "models/person_ssdlite.onnx",
        providers=["cpu"],
        labels=["x"],
        labels_file=labels_file,
    )

    assert from_file.info.labels == ("cat", "dog")
    assert both.info.labels == ("x",)


def test_unreadable_labels_file_names_it(tmp_path: Path) -> None:
    with pytest.raises(ModelLoadError, match=r"'pets'.*labels file .*missing\.txt"):
        _load(
            "pets",
            "models/person_ssdlite.onnx",
            providers=["cpu"],
            labels_file=tmp_path / "missing.txt",
        )


@pytest.mark.parametrize(
    ("metadata", "labels"),
    [
        ({"names": "{1: 'Fall', 0: 'Normal'}"}, ("Normal", "Fall")),
        ({"names": "['a', 'b']"}, ("a", "b")),
        ({"names": "not python", "classes": "a, b"}, ("a", "b")),
        ({"labels": '["car", "bus"]'}, ("car", "bus")),
        ({"classes": "car\nbus\n\n"}, ("car", "bus")),
        ({"author": "someone"}, ()),
    ],
)
def test_labels_from_metadata(metadata: dict[str, str], labels: tuple[str, ...]) -> None:
    assert labels_from_metadata(metadata) == labels


def test_requested_providers_keep_order_and_end_with_cpu() -> None:
    assert requested_providers(["tensorrt", "cuda"]) == (
        "TensorrtExecutionProvider",
        "CUDAExecutionProvider",
        CPU,
    )
    assert requested_providers(["cuda", "cpu", "cuda"]) == ("CUDAExecutionProvider", CPU)


def test_the_default_providers_ask_only_for_what_loads_here(
    caplog: pytest.LogCaptureFixture, capfd: pytest.CaptureFixture[str]
) -> None:
    """No `providers` in the config: GPU first where its libraries load; on a machine
    without them, the CPU, and no warning about a GPU nobody asked for."""
    caplog.set_level(logging.INFO)
    model = _load("person", "models/person_ssdlite.onnx")
    if model.info.providers[0] != CPU:
        pytest.skip("a GPU provider works on this machine: the default uses it")
    assert _warnings(caplog) == []
    assert "EP Error" not in capfd.readouterr().out
    assert "model 'person': providers " + CPU in caplog.text


@pytest.mark.parametrize("asked", ["cuda", "tensorrt"])
def test_missing_gpu_provider_falls_back_to_cpu_with_one_warning(
    asked: str, caplog: pytest.LogCaptureFixture, capfd: pytest.CaptureFixture[str]
) -> None:
    model = _load("person", "models/person_ssdlite.onnx", providers=[asked, "cpu"])
    if model.info.providers[0] != CPU:
        pytest.skip(f"{asked} works on this machine: nothing falls back")

    warnings = _warnings(caplog)
    assert len(warnings) == 1
    message = warnings[0].getMessage()
    assert f"model 'person': asked for {asked}, running on {CPU}" in message
    assert "install" in message
    assert warnings[0].exc_info is None
    out, err = capfd.readouterr()
    assert "EP Error" not in out  # ORT's own fallback banner
    assert "onnxruntime" not in err  # ORT's provider-library error log
    outputs = model.session.run(None, {model.input_name: np.zeros((1, 64, 64, 3), np.uint8)})
    assert len(outputs) == 4


def test_session_options_come_from_config() -> None:
    session = SessionSpec(intra_op_threads=1, inter_op_threads=1, graph_optimization="basic")
    model = _load("person", "models/person_ssdlite.onnx", providers=["cpu"], session=session)

    options = model.session.get_session_options()
    assert options.intra_op_num_threads == 1
    assert options.inter_op_num_threads == 1
    assert options.graph_optimization_level == ort.GraphOptimizationLevel.ORT_ENABLE_BASIC


def test_without_the_memory_arena_a_model_gives_the_same_outputs() -> None:
    kept = _load("person", "models/person_ssdlite.onnx", providers=["cpu"])
    freed = _load(
        "person", "models/person_ssdlite.onnx", providers=["cpu"],
        session=SessionSpec(memory_arena=False),
    )  # fmt: skip
    assert kept.session.get_session_options().enable_cpu_mem_arena is True
    assert freed.session.get_session_options().enable_cpu_mem_arena is False
    rng = np.random.default_rng(0)
    for batch in (1, 4, 2):  # a larger batch then a smaller one: buffers freed in between
        images = rng.integers(0, 255, (batch, 300, 300, 3), np.uint8)
        feed = {kept.input_name: images}
        for a, b in zip(kept.session.run(None, feed), freed.session.run(None, feed), strict=True):
            assert np.array_equal(a, b)


def test_missing_file_names_model_and_file(tmp_path: Path) -> None:
    missing = tmp_path / "nope.onnx"
    with pytest.raises(ModelLoadError, match=r"'ghost'.*file not found") as caught:
        _load("ghost", missing)
    assert str(missing) in str(caught.value)


def test_text_file_is_not_an_onnx_model(tmp_path: Path) -> None:
    fake = tmp_path / "fake.onnx"
    fake.write_text("this is not a model\n", encoding="utf-8")

    with pytest.raises(ModelLoadError) as caught:
        _load("fake", fake)  # default providers: cuda, cpu

    message = str(caught.value)
    assert message.startswith(f"model 'fake': not a valid ONNX model: {fake}: ")
    assert "Protobuf" in message
    assert "[ONNXRuntimeError]" not in message


def test_more_than_one_input_is_refused(two_input_model_path: Path) -> None:
    with pytest.raises(ModelLoadError, match=r"'sum'.*add_two_inputs\.onnx has 2 inputs \(a, b\)"):
        _load("sum", two_input_model_path, providers=["cpu"])


def test_a_worker_process_takes_its_share_of_the_cores(monkeypatch: pytest.MonkeyPatch) -> None:
    """`serve --workers N`: models that leave intra-op threads at 0 get cores // N (at
    least 1) in each worker, not one thread per core in every process."""
    from appliance.models.session import PROCESS, session_options, share_cores

    monkeypatch.setattr(PROCESS, "intra_op_threads", 0)
    assert session_options(SessionSpec()).intra_op_num_threads == 0  # ORT's default
    cores = len(os.sched_getaffinity(0))
    assert share_cores(2) == max(1, cores // 2)
    assert session_options(SessionSpec()).intra_op_num_threads == max(1, cores // 2)
    assert share_cores(10 * cores) == 1
    explicit = SessionSpec(intra_op_threads=3)  # a model that says: kept
    assert session_options(explicit).intra_op_num_threads == 3
