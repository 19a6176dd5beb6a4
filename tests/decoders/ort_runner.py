"""Run a real ONNX model directly with ONNX Runtime, for decoder tests (no batcher).

`ModelInfo` is read from the model file itself, so the tests check the decoders against
what real exports declare rather than against hand-written shapes.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from pathlib import Path

import cv2
import numpy as np
import onnxruntime as ort

from appliance.models.session import labels_from_metadata
from pipelines.decoders import DecodeOptions, Decoder, build_decoder
from pipelines.models import ModelInfo, Tensor, TensorInfo
from pipelines.types import Detections, Image

ROOT = Path(__file__).resolve().parents[2]
MODELS = ROOT / "configs" / "models"
PHOTOS = ROOT / "configs" / "media" / "sources"

# ONNX Runtime's type strings -> numpy dtype names, as ModelInfo carries them
_DTYPES = {
    "tensor(float)": "float32",
    "tensor(float16)": "float16",
    "tensor(double)": "float64",
    "tensor(uint8)": "uint8",
    "tensor(int8)": "int8",
    "tensor(int32)": "int32",
    "tensor(int64)": "int64",
}


class OrtRunner:
    """One CPU session; `run` adds the batch dim to a sample and strips it from outputs."""

    def __init__(self, path: Path) -> None:
        options = ort.SessionOptions()
        options.intra_op_num_threads = 2  # the test machine's cores, shared
        options.log_severity_level = 3  # errors only
        self.path = path
        self.session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])

    def info(
        self,
        decoder: str,
        *,
        model_id: str | None = None,
        labels: Sequence[str] = (),
        input_size: tuple[int, int] | None = None,
    ) -> ModelInfo:
        """The model's declared interface as the runtime describes it (labels from the
        model's metadata when none are given)."""
        meta = self.session.get_modelmeta().custom_metadata_map
        return ModelInfo(
            id=model_id or self.path.stem,
            path=str(self.path),
            inputs=tuple(_tensor(n) for n in self.session.get_inputs()),
            outputs=tuple(_tensor(n) for n in self.session.get_outputs()),
            decoder=decoder,
            labels=tuple(labels) or labels_from_metadata(meta),
            input_size=input_size,
            metadata=dict(meta),
        )

    def run(self, sample: Tensor) -> list[Tensor]:
        name = self.session.get_inputs()[0].name
        outputs = self.session.run(None, {name: sample[None]})
        return [np.asarray(o)[0] for o in outputs]

    def detect(self, decoder: Decoder, image: Image) -> Detections:
        """preprocess -> run -> decode, as the detect block does per frame."""
        sample, transform = decoder.preprocess(image)
        return decoder.decode(self.run(sample), transform)

    def decoder(
        self,
        kind: str,
        options: DecodeOptions | None = None,
        *,
        labels: Sequence[str] = (),
        input_size: tuple[int, int] | None = None,
    ) -> Decoder:
        """`build_decoder` for this model, as the compiler calls it."""
        info = self.info(kind, labels=labels, input_size=input_size)
        return build_decoder(info, options or DecodeOptions())


@functools.cache
def runner(path: Path) -> OrtRunner:
    """One session per model file for the whole test run (loading costs ~0.3 s)."""
    return OrtRunner(path)


def bundled(name: str) -> OrtRunner:
    """A model shipped in configs/models, e.g. bundled('person_ssdlite')."""
    return runner(MODELS / f"{name}.onnx")


def photo(name: str) -> Image:
    """A test photo as a BGR uint8 frame (the greyscale ones expanded to 3 channels)."""
    image = cv2.imread(str(PHOTOS / f"{name}.png"), cv2.IMREAD_COLOR)
    assert image is not None, name
    return np.asarray(image, np.uint8)


def pasted(image: Image, offset: tuple[int, int], size: tuple[int, int] = (960, 540)) -> Image:
    """`image` pasted at offset (x, y) into a mid-grey canvas of size (width, height)."""
    canvas = np.full((size[1], size[0], 3), 90, np.uint8)
    x, y = offset
    canvas[y : y + image.shape[0], x : x + image.shape[1]] = image
    return canvas


def _tensor(node: ort.NodeArg) -> TensorInfo:
    return TensorInfo(node.name, tuple(node.shape), _DTYPES.get(node.type, node.type))


def iou(a: Sequence[float], b: Sequence[float]) -> float:
    """Intersection over union of two xyxy boxes."""
    w = max(0.0, min(a[2], b[2]) - max(a[0], b[0]))
    h = max(0.0, min(a[3], b[3]) - max(a[1], b[1]))
    inter = w * h
    area = (a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1])
    return inter / (area - inter)


def shifted(box: Sequence[float], offset: tuple[int, int]) -> list[float]:
    """An xyxy box moved by offset (x, y)."""
    x, y = offset
    return [box[0] + x, box[1] + y, box[2] + x, box[3] + y]
