"""What `appliance blocks` prints: every block type with its inputs, outputs, parameters."""

from __future__ import annotations

from typing import Any

from pipelines.blocks.base import OPTIONAL
from pipelines.registry import BlockImportError, BlockRegistry


def describe_blocks(registry: BlockRegistry) -> list[dict[str, Any]]:
    """One JSON-ready entry per registered type; an import failure becomes `error`."""
    out: list[dict[str, Any]] = []
    for name in registry.names():
        entry: dict[str, Any] = {"type": name, "plugin": name in registry.plugins}
        try:
            cls = registry.get(name)
        except BlockImportError as exc:
            out.append({**entry, "description": "", "error": str(exc)})
            continue
        entry["description"] = cls.description or (cls.__doc__ or "").strip().split("\n")[0]
        entry["inputs"] = {k: _input_text(kind, d) for k, (kind, d) in cls.inputs.items()}
        entry["outputs"] = dict(cls.outputs)
        entry["parameters"] = {
            field: {
                "type": _type_text(info.annotation),
                "required": info.is_required(),
                "default": None if info.is_required() else _jsonable(info.get_default()),
            }
            for field, info in cls.Params.model_fields.items()
        }
        out.append(entry)
    return out


def _input_text(kind: str, default: str | None) -> str:
    if default is None:
        return f"{kind} (required)"
    return f"{kind} (optional)" if default == OPTIONAL else f"{kind} (default {default})"


def _type_text(annotation: Any) -> str:
    text = getattr(annotation, "__name__", None) or str(annotation)
    return text.replace("typing.", "")


def _jsonable(value: Any) -> Any:
    if value is None or isinstance(value, str | int | float | bool):
        return value
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    return str(value)
