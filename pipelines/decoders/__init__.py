"""Model output decoders, one module per format, registered as import strings.

The registry is plain data (uvicorn's `HTTP_PROTOCOLS` practice): a decoder module, and
whatever it imports, loads only when a model of its kind is compiled.
"""

from __future__ import annotations

from pipelines.decoders.base import DecodeOptions, Decoder, DecoderError, DecoderFactory, Transform
from pipelines.decoders.prologue import Prologue
from pipelines.importer import import_from_string
from pipelines.models import ModelInfo

__all__ = [
    "DECODERS",
    "DecodeOptions",
    "Decoder",
    "DecoderError",
    "DecoderFactory",
    "Prologue",
    "Transform",
    "build_decoder",
    "decoder_factory",
    "decoder_prologue",
]

DECODERS: dict[str, str] = {
    "tf_od": "pipelines.decoders.tf_od:TfOdDecoder",
    "yolo": "pipelines.decoders.yolo:YoloDecoder",
    "centerface": "pipelines.decoders.centerface:CenterFaceDecoder",
    "dbnet": "pipelines.decoders.dbnet:DbNetDecoder",
}


def decoder_factory(kind: str) -> DecoderFactory:
    """The decoder class registered as `kind`; DecoderError listing the known kinds."""
    target = DECODERS.get(kind)
    if target is None:
        known = ", ".join(sorted(DECODERS))
        raise DecoderError(f"unknown decoder {kind!r}; known decoders: {known}")
    factory: DecoderFactory = import_from_string(target)
    return factory


def build_decoder(info: ModelInfo, options: DecodeOptions) -> Decoder:
    """Build and validate the decoder for `info.decoder` (all checks happen here)."""
    return _factory_of(info)(info, options)


def decoder_prologue(info: ModelInfo) -> Prologue | None:
    """The pixel preprocessing `info.decoder` can leave to the graph for the model file
    `info` describes (None: none); DecoderError when the kind is unknown or the model
    does not fit it."""
    return _factory_of(info).prologue(info)


def _factory_of(info: ModelInfo) -> DecoderFactory:
    """`info.decoder`'s class; DecoderError naming the model when the kind is unknown."""
    try:
        return decoder_factory(info.decoder)
    except DecoderError as exc:
        raise DecoderError(f"model {info.id!r}: {exc}") from None
