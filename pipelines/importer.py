"""`"module:attr"` import strings, resolved lazily, with precise errors (uvicorn's
importer.py practice). The block, decoder and sink registries map names to such strings,
so an optional dependency (paho for MQTT, a plugin's own packages) loads only when used.
"""

from __future__ import annotations

import importlib
from typing import Any


class ImportFromStringError(ImportError):
    """An import string that does not name an importable attribute."""


def import_from_string(target: str) -> Any:
    """The object `target` ("package.module:attr", attr may be dotted) names.

    ImportFromStringError says which part failed: the format, the module (with the
    module's own error, since a plugin's module may raise anything) or the attribute.
    """
    module_name, sep, attrs = target.partition(":")
    if not sep or not module_name or not attrs:
        raise ImportFromStringError(f"{target!r}: expected the form 'module:attribute'")
    try:
        obj: Any = importlib.import_module(module_name)
    except Exception as exc:  # a module may raise anything at import
        raise ImportFromStringError(f"cannot import {target!r}: {exc}") from exc
    for attr in attrs.split("."):
        try:
            obj = getattr(obj, attr)
        except AttributeError:
            message = f"cannot import {target!r}: {module_name!r} has no attribute {attrs!r}"
            raise ImportFromStringError(message) from None
    return obj
