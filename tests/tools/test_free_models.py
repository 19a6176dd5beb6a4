"""The benches' near-free stand-ins (bench/_free_models.py): ONNX Runtime loads them, and
the real decoders read from them the detections they were made with, at any batch size,
so a bench that swaps them in still runs the appliance's decoding on real-shaped outputs."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest

from bench._free_models import FACES, PEOPLE, STRIDE, free_centerface, free_tf_od
from bench._reference import Spec, model_info
from pipelines.decoders import build_decoder
from pipelines.decoders.base import DecodeOptions

H, W = 480, 640  # a bench camera's frame


def decoded(path: Path, decoder: str, batch: int) -> list[np.ndarray]:
    """Each image's boxes (x1, y1, x2, y2 in frame px) as the real decoder reads them."""
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    spec = Spec([], str(path), decoder, None, ["face" if decoder == "centerface" else "person"],
                0.5, batch)  # fmt: skip
    dec = build_decoder(model_info(session, spec), DecodeOptions(confidence=0.5))
    frames = [np.full((H, W, 3), 40 * i, np.uint8) for i in range(batch)]
    prepared = [dec.preprocess(f) for f in frames]
    name = session.get_inputs()[0].name
    outputs = session.run(None, {name: np.stack([s for s, _ in prepared])})
    return [dec.decode([o[i] for o in outputs], t).xyxy for i, (_, t) in enumerate(prepared)]


@pytest.mark.parametrize("batch", [1, 3])
def test_the_centerface_stand_in_answers_its_faces_in_frame_pixels(
    tmp_path: Path, batch: int
) -> None:
    path = free_centerface(tmp_path / "faces.onnx")
    # x1, y1, x2, y2 of each face: centred at its cell's middle, its size in input px.
    expected = np.array(sorted(
        ((col + 0.5) * STRIDE - w / 2, (row + 0.5) * STRIDE - h / 2,
         (col + 0.5) * STRIDE + w / 2, (row + 0.5) * STRIDE + h / 2)
        for row, col, h, w in FACES
    ))  # fmt: skip
    for boxes in decoded(path, "centerface", batch):
        np.testing.assert_allclose(sorted(boxes.tolist()), expected, atol=1e-3)


@pytest.mark.parametrize("batch", [1, 3])
def test_the_tf_od_stand_in_answers_its_people_in_frame_pixels(tmp_path: Path, batch: int) -> None:
    path = free_tf_od(tmp_path / "person.onnx")
    scale = np.array([W, H, W, H], np.float32)
    expected = sorted((np.array(p)[[1, 0, 3, 2]] * scale).tolist() for p in PEOPLE)
    for boxes in decoded(path, "tf_od", batch):
        np.testing.assert_allclose(sorted(boxes.tolist()), expected, atol=0.2)
