"""What the batcher tests share: a model loaded on the CPU as the tests feed it, the
person detector, and three real photos as its samples."""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import Future
from pathlib import Path

import cv2
import numpy as np
import pytest

from appliance.models import LoadedModel, load_model
from pipelines.models import Tensor
from pipelines.spec import ModelSpec
from tests.support.models import MODELS, REPO

IMAGES = REPO / "configs" / "media" / "sources"
TIMEOUT_S = 30.0  # generous upper bound for a future on a busy 2-core CI machine


def load_cpu(model_id: str, path: Path, decoder: str = "tf_od") -> LoadedModel:
    """The model on the CPU, fed its own input (preprocess: host), not frames."""
    spec = {"path": path, "decoder": decoder, "providers": ["cpu"], "preprocess": "host"}
    return load_model(model_id, ModelSpec.model_validate(spec), Path.resolve)


@pytest.fixture(scope="module")
def person() -> LoadedModel:
    return load_cpu("person", MODELS / "person_ssdlite.onnx")


@pytest.fixture(scope="module")
def frames() -> list[Tensor]:
    """Three real photos as person_ssdlite samples: RGB uint8 [300, 300, 3]."""
    out: list[Tensor] = []
    for name in ("astronaut", "camera", "grass"):
        bgr = cv2.imread(str(IMAGES / f"{name}.png"))
        assert bgr is not None, f"cannot read {name}.png"
        out.append(np.ascontiguousarray(cv2.resize(bgr, (300, 300))[:, :, ::-1]))
    return out


def outputs_of(futures: Sequence[Future[Sequence[Tensor]]]) -> list[Sequence[Tensor]]:
    """Each future's outputs, waited for (at most TIMEOUT_S each)."""
    return [f.result(timeout=TIMEOUT_S) for f in futures]
