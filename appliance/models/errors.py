"""The model layer's error and ONNX Runtime's messages made readable: a leaf module, so
that what `session.py` uses (providers, warm-up, the prologue) can raise it too."""

from __future__ import annotations

import re
from collections.abc import Mapping

# "[ONNXRuntimeError] : 7 : INVALID_PROTOBUF : Load model from x.onnx failed:" → "".
_ORT_PREFIX = re.compile(r"^\[ONNXRuntimeError\] : \d+ : \w+ : (Load model from .* failed:)?")


class ModelLoadError(Exception):
    """A model cannot be loaded; the message names the model id and the file."""


def describe_ort_error(exc: Exception) -> str:
    """An ORT exception's first line, without its code prefix and the repeated path."""
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return _ORT_PREFIX.sub("", text).strip() or type(exc).__name__


def as_declared(message: str, names: Mapping[str, str]) -> str:
    """`message` with each checked, absolute path in it (a key of `names`) named as it
    was declared: an answer to a request names its files as the request did, never by
    the host's folders."""
    for path, name in names.items():
        message = message.replace(path, name)
    return message
