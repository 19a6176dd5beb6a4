"""Block type name -> import string, imported lazily (uvicorn's importer practice).

Built-ins are plain data below; plugins add theirs through the `appliance.blocks`
entry-point group (a later issue wires discovery into start-up).
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping

from pipelines.blocks.base import BlockType

BUILTIN_BLOCKS: Mapping[str, str] = {
    "annotate": "pipelines.blocks.annotate:AnnotateBlock",
    "blur": "pipelines.blocks.blur:BlurBlock",
    "classify": "pipelines.blocks.classify:ClassifyBlock",
    "crop": "pipelines.blocks.crop:CropBlock",
    "detect": "pipelines.blocks.detect:DetectBlock",
    "filter": "pipelines.blocks.filter:FilterBlock",
    "line_counter": "pipelines.blocks.line_counter:LineCounterBlock",
    "ocr": "pipelines.blocks.ocr:OcrBlock",
    "rate_limit": "pipelines.blocks.rate_limit:RateLimitBlock",
    "track": "pipelines.blocks.track:TrackBlock",
    "zone_counter": "pipelines.blocks.zone_counter:ZoneCounterBlock",
}


class BlockImportError(ImportError):
    """A registered block type could not be imported."""


class BlockRegistry:
    """Resolves type names to block classes, importing each module once."""

    def __init__(self, entries: Mapping[str, str] = BUILTIN_BLOCKS) -> None:
        self._entries = dict(entries)
        self._loaded: dict[str, type[BlockType]] = {}

    def names(self) -> list[str]:
        return sorted(self._entries)

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def get(self, name: str) -> type[BlockType]:
        cls = self._loaded.get(name)
        if cls is None:
            cls = self._loaded[name] = _import(name, self._entries[name])
        return cls


def _import(name: str, target: str) -> type[BlockType]:
    module_name, _, attr = target.partition(":")
    try:
        obj = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as exc:
        raise BlockImportError(f"block type {name!r}: cannot import {target!r}: {exc}") from exc
    if not (isinstance(obj, type) and issubclass(obj, BlockType)):
        raise BlockImportError(f"block type {name!r}: {target!r} is not a BlockType subclass")
    return obj


DEFAULT_REGISTRY = BlockRegistry()
