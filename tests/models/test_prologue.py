"""Decoder prologues composed into real ONNX graphs, opened by the real ONNX Runtime.

An identity model (y = x) composed with a prologue outputs the prologue's own result, so
it can be compared bit for bit with the decoder's numpy path on a real frame.
"""

from __future__ import annotations

import logging
import stat
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from appliance.models import LoadedModel, ModelLoadError, load_model
from appliance.models.prologue import Composed, compose
from appliance.models.session import _in_graph
from appliance.profiling.ort_profile import profiling_session, read_profile
from pipelines.decoders.centerface import CenterFaceDecoder
from pipelines.decoders.dbnet import PROLOGUE as DBNET_PROLOGUE
from pipelines.decoders.dbnet import limited_resize
from pipelines.decoders.prologue import Prologue
from pipelines.models import Tensor
from pipelines.spec import ModelSpec
from pipelines.types import Image
from tests.decoders.ort_runner import bundled, photo
from tests.support.models import MODELS

CENTERFACE = MODELS / "centerface.onnx"


def _load(
    path: Path, decoder: str | None, preprocess: str = "graph", cache: Path | None = None
) -> LoadedModel:
    spec = ModelSpec.model_validate(
        {
            "path": path,
            "decoder": decoder,
            "providers": ["cpu"],
            "preprocess": preprocess,
            "session": {"intra_op_threads": 1, "warmup": False},
        }
    )
    return load_model(path.stem, spec, Path.resolve, cache_dir=cache)


def _identity(path: Path, dtype: int = TensorProto.FLOAT, opset: int = 13) -> Path:
    """y = x, x of `dtype` [n, 3, h, w]: the composed model outputs its prologue's result."""
    dims: list[str | int] = ["n", 3, "h", "w"]
    graph = helper.make_graph(
        [helper.make_node("Identity", ["x"], ["y"])],
        "identity",
        [helper.make_tensor_value_info("x", dtype, dims)],
        [helper.make_tensor_value_info("y", dtype, dims)],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 7
    onnx.save(model, path)
    return path


def _frame() -> Image:
    """A real photo pasted into a 960x540 frame: 540 rows need CenterFace's padding."""
    frame = np.full((540, 960, 3), 90, np.uint8)
    frame[10:522, 100:612] = photo("astronaut")
    return frame


def _run(model: LoadedModel, sample: Tensor) -> list[Tensor]:
    return list(model.session.run(model.output_names, {model.input_name: sample[None]}))


@pytest.mark.parametrize(
    ("kind", "model_file"),
    [("centerface", "centerface.onnx"), ("dbnet", "ppocr_v4_det.onnx")],
)
def test_the_graph_computes_what_numpy_computes_bit_for_bit(
    kind: str, model_file: str, tmp_path: Path
) -> None:
    host = bundled(model_file.removesuffix(".onnx")).decoder(kind)  # the numpy path
    composed = _load(_identity(tmp_path / "identity.onnx"), kind, "graph")
    frame = _frame()
    want, _ = host.preprocess(frame)
    # What the graph decoder hands over: the frame itself (CenterFace pads in the graph),
    # or the frame resized (DBNet's geometry stays on the host).
    sample = frame if kind == "centerface" else limited_resize(960, 540)(frame)[0]

    (got,) = _run(composed, sample)
    assert got.dtype == want.dtype and got.shape[1:] == want.shape
    np.testing.assert_array_equal(got[0], want)


def test_float16_models_get_the_scaled_float32_cast_down(tmp_path: Path) -> None:
    """YOLO's float16 prologue: float32 maths, then the cast, as `planar_rgb` does."""
    path = _identity(tmp_path / "half.onnx", TensorProto.FLOAT16)
    prologue = Prologue("float16", "NCHW", reverse_channels=True, scale=(1 / 255,) * 3)
    composed = compose(onnx.load(path), prologue)
    model = _load(path, "yolo", "graph")
    image = _frame()[100:164, 200:296].copy()  # inside the photo: colours differ

    (got,) = _run(model, image)
    assert model.info.prologue is not None and model.info.prologue.dtype == "float16"
    want = (image[:, :, ::-1].transpose(2, 0, 1).astype(np.float32) * np.float32(1 / 255)).astype(
        np.float16
    )
    np.testing.assert_array_equal(got[0], want)
    assert composed.graph.input[0].type.tensor_type.elem_type == TensorProto.UINT8


def test_composed_model_takes_uint8_nhwc_and_keeps_the_rest(
    yolov8_fixed_batch_model: Path,
) -> None:
    original = onnx.load(yolov8_fixed_batch_model)
    host = _load(yolov8_fixed_batch_model, "yolo", "host")
    model = _load(yolov8_fixed_batch_model, "yolo")  # auto: the decoder has a prologue

    arg = model.session.get_inputs()[0]
    assert (arg.type, arg.shape) == ("tensor(uint8)", [1, 640, 640, 3])
    assert model.session_input.dtype == "uint8"
    assert model.input_name != "images"  # the original name is inside the graph now
    assert model.info.inputs == host.info.inputs  # the file's own, as decoders check it
    assert model.info.outputs == host.info.outputs
    assert (
        model.info.metadata
        == host.info.metadata
        == {p.key: p.value for p in original.metadata_props}
    )
    assert model.info.labels == ("Normal", "Fall")
    assert isinstance(model.source, bytes)  # no cache: composed in memory
    composed = onnx.load_model_from_string(model.source)
    assert composed.ir_version == original.ir_version
    assert list(composed.opset_import) == list(original.opset_import)


def test_composed_model_is_cached_and_reused(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    first = _load(CENTERFACE, "centerface", cache=cache)
    (path,) = cache.iterdir()
    before = path.stat()
    second = _load(CENTERFACE, "centerface", cache=cache)

    assert first.source == second.source == str(path)
    after = path.stat()
    assert (after.st_ino, after.st_mtime_ns) == (before.st_ino, before.st_mtime_ns)
    assert stat.S_IMODE(after.st_mode) == 0o600
    assert list(cache.iterdir()) == [path]  # no temporary file left
    another = _load(CENTERFACE, "centerface", cache=cache, preprocess="host")
    assert another.source == str(CENTERFACE)


@pytest.mark.parametrize("damage", ["garbage", "truncated", "cut_at_a_field"])
def test_a_corrupt_cache_entry_is_rebuilt(
    damage: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    cache = tmp_path / "cache"
    good = _load(CENTERFACE, "centerface", cache=cache)
    (path,) = cache.iterdir()
    blob = path.read_bytes()
    if damage == "garbage":
        path.write_bytes(b"not a model\xff\xff")
    elif damage == "truncated":
        path.write_bytes(blob[: len(blob) // 2])
    else:  # a valid message without its graph: parses, but is not the composed model
        model = onnx.load_model_from_string(blob)
        model.ClearField("graph")
        path.write_bytes(model.SerializeToString())

    rebuilt = _load(CENTERFACE, "centerface", cache=cache)

    assert path.read_bytes() == blob
    assert any("composing it again" in r.getMessage() for r in caplog.records)
    image = _frame()
    for want, got in zip(_run(good, image), _run(rebuilt, image), strict=True):
        np.testing.assert_array_equal(got, want)


def _auto_on_a_gpu(path: Path, decoder: str, model_id: str = "m") -> Composed | None:
    """What `preprocess: auto` composes where the session runs on a GPU provider (on the
    CPU auto is the host, whatever the model): the rule itself, as load_model asks it."""
    spec = ModelSpec.model_validate({"path": path, "decoder": decoder, "preprocess": "auto"})
    return _in_graph(model_id, spec, path, None, on_gpu=True)


def test_auto_is_the_host_on_the_cpu_and_the_graph_on_a_gpu() -> None:
    assert _load(CENTERFACE, "centerface", "auto").info.prologue is None
    composed = _auto_on_a_gpu(CENTERFACE, "centerface")
    assert composed is not None and composed.prologue.reverse_channels


def test_graph_without_a_decoder_is_a_config_error() -> None:
    with pytest.raises(ModelLoadError) as caught:
        _load(CENTERFACE, None, "graph")
    assert str(caught.value) == (
        "model 'centerface': preprocess 'graph': the model has no decoder, so no pixel "
        "preprocessing to move; use 'auto' or 'host'"
    )
    assert _load(CENTERFACE, None, "auto").session_input.dtype == "float32"  # auto: host


def test_graph_for_a_model_that_does_not_fit_its_decoder(tmp_path: Path) -> None:
    path = _identity(tmp_path / "half.onnx", TensorProto.FLOAT16)
    with pytest.raises(ModelLoadError, match=r"preprocess 'graph': decoder 'dbnet' expects"):
        _load(path, "dbnet", "graph")
    assert _auto_on_a_gpu(path, "dbnet") is None  # auto: the compiler says why


def test_a_graph_that_does_not_compose_warns_once_under_auto(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = _identity(tmp_path / "old.onnx", opset=8)  # older than ConstantOfShape
    assert _auto_on_a_gpu(path, "centerface", "old") is None
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert warnings == [
        "model 'old': preprocessing stays on the host: the model's opset 8 is older than 9"
    ]
    with pytest.raises(ModelLoadError, match=r"'old': preprocess 'graph': the model's opset 8"):
        _load(path, "centerface", "graph")


def test_a_model_with_external_weights_stays_on_the_host(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """y = x * w, w in a file beside the model: composing would cut it off its weights."""
    dims: list[str | int] = ["n", 3, "h", "w"]
    weight = onnx.numpy_helper.from_array(np.full((1, 3, 1, 1), 2.0, np.float32), "weight")
    graph = helper.make_graph(
        [helper.make_node("Mul", ["x", "weight"], ["y"])],
        "scaled",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, dims)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, dims)],
        [weight],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 7
    path = tmp_path / "scaled.onnx"
    onnx.save(model, path, save_as_external_data=True, size_threshold=0, location="w.bin")

    assert _auto_on_a_gpu(path, "dbnet", "scaled") is None
    assert "external data" in caplog.text
    with pytest.raises(ModelLoadError, match=r"'scaled': preprocess 'graph': .*external data"):
        _load(path, "dbnet", "graph")


def test_the_profiling_twin_opens_the_composed_model(tmp_path: Path) -> None:
    model = _load(CENTERFACE, "centerface", cache=tmp_path / "cache")
    twin = profiling_session(model, ModelSpec(path=CENTERFACE).session, tmp_path, spin=False)
    image = _frame()

    assert twin.get_inputs()[0].type == "tensor(uint8)"
    outputs = twin.run(model.output_names, {model.input_name: image[None]})
    for want, got in zip(_run(model, image), outputs, strict=True):
        np.testing.assert_array_equal(got, want)
    assert read_profile(twin)  # and its profile reads back


def test_centerface_says_its_prologue_from_the_file_info() -> None:
    info = bundled("centerface").info("centerface")
    assert CenterFaceDecoder.prologue(info).pad_multiple == 32
    sized = bundled("centerface").info("centerface", input_size=(640, 480))
    assert CenterFaceDecoder.prologue(sized).pad_multiple == 1  # the letterbox pads
    assert DBNET_PROLOGUE.offsets and DBNET_PROLOGUE.scales
