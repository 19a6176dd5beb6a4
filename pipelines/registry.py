"""Block type name -> import string, imported lazily (uvicorn's importer practice).

Built-ins are plain data below. Users add block types as Python classes published through
the `appliance.blocks` entry-point group (`[project.entry-points."appliance.blocks"]
my_block = "my_pkg.blocks:MyBlock"`); `load_plugins` imports and checks each at start-up,
and a broken plugin is reported by name without touching the built-ins.
"""

from __future__ import annotations

from collections.abc import Mapping
from importlib.metadata import entry_points

from pydantic import BaseModel

from pipelines.blocks.base import BlockType
from pipelines.importer import ImportFromStringError, import_from_string

PLUGIN_GROUP = "appliance.blocks"

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
    """A registered block type could not be imported, or is not a valid block type."""


class BlockRegistry:
    """Resolves type names to block classes, importing each module once."""

    def __init__(self, entries: Mapping[str, str] = BUILTIN_BLOCKS) -> None:
        self._entries = dict(entries)
        self._loaded: dict[str, type[BlockType]] = {}
        self.plugins: dict[str, str] = {}  # plugin name -> import string
        self.broken: dict[str, str] = {}  # plugin name -> why it was left out
        self._plugin_groups: set[str] = set()

    def names(self) -> list[str]:
        return sorted(self._entries)

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def get(self, name: str) -> type[BlockType]:
        cls = self._loaded.get(name)
        if cls is None:
            cls = self._loaded[name] = _import(name, self._entries[name])
        return cls

    def load_plugins(self, group: str = PLUGIN_GROUP) -> dict[str, str]:
        """Import every block type published in `group`; returns {name: problem} for those
        left out (import errors, not a BlockType, a name taken by a built-in). Each
        group is loaded once; later calls return the same problems."""
        if group in self._plugin_groups:
            return dict(self.broken)
        self._plugin_groups.add(group)
        for ep in entry_points(group=group):
            if ep.name in self._entries:
                self.broken[ep.name] = f"the name is taken by {self._entries[ep.name]!r}"
                continue
            try:
                self._loaded[ep.name] = _import(ep.name, ep.value)
            except BlockImportError as exc:
                self.broken[ep.name] = str(exc)
                continue
            self._entries[ep.name] = self.plugins[ep.name] = ep.value
        return dict(self.broken)


def _import(name: str, target: str) -> type[BlockType]:
    try:
        obj = import_from_string(target)
    except ImportFromStringError as exc:
        raise BlockImportError(f"block type {name!r}: {exc}") from exc
    if not (isinstance(obj, type) and issubclass(obj, BlockType)):
        raise BlockImportError(f"block type {name!r}: {target!r} is not a BlockType subclass")
    if not (isinstance(obj.Params, type) and issubclass(obj.Params, BaseModel)):
        raise BlockImportError(f"block type {name!r}: {target!r}.Params is not a pydantic model")
    return obj


DEFAULT_REGISTRY = BlockRegistry()
