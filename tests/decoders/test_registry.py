"""The decoder registry: plain import strings, loaded lazily, precise errors."""

from __future__ import annotations

import subprocess
import sys

import pytest

from pipelines.decoders import DECODERS, DecodeOptions, DecoderError, build_decoder
from pipelines.decoders.centerface import CenterFaceDecoder
from pipelines.decoders.tf_od import TfOdDecoder
from tests.decoders.ort_runner import ROOT, bundled


def test_unknown_kind_lists_the_known_ones() -> None:
    info = bundled("person_ssdlite").info("ssd_mobilenet", model_id="people")
    with pytest.raises(DecoderError) as err:
        build_decoder(info, DecodeOptions())
    assert str(err.value) == (
        "model 'people': unknown decoder 'ssd_mobilenet'; "
        "known decoders: centerface, dbnet, tf_od, yolo"
    )


@pytest.mark.parametrize(
    ("model", "kind", "cls"),
    [("person_ssdlite", "tf_od", TfOdDecoder), ("centerface", "centerface", CenterFaceDecoder)],
)
def test_build_decoder_picks_the_registered_class(model: str, kind: str, cls: type) -> None:
    assert isinstance(build_decoder(bundled(model).info(kind), DecodeOptions()), cls)


def test_decoder_modules_load_only_when_used() -> None:
    code = (
        "import sys, pipelines.decoders as d; "
        "loaded = [m for m in (*d.DECODERS, 'cv2', 'onnxruntime') "
        "if any(k.endswith(m) for k in sys.modules)]; print(loaded)"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True
    )
    assert done.stdout.strip() == "[]"
    assert sorted(DECODERS) == ["centerface", "dbnet", "tf_od", "yolo"]
