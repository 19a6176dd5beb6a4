"""What `appliance blocks` prints: every block type with its inputs, outputs, parameters."""

from __future__ import annotations

import types
import typing
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
    """A parameter's type in plain words: `one of 'track', 'class'`, `int >= 1`,
    `(int >= 1, int >= 1) or none`, `list of str`."""
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is typing.Literal:
        return "one of " + ", ".join(repr(a) for a in args)
    if origin is typing.Annotated:
        return _type_text(args[0]) + "".join(_bounds(m) for m in args[1:])
    if origin in (types.UnionType, typing.Union):
        kept = [_type_text(a) for a in args if a is not type(None)]
        return " or ".join(kept) + (" or none" if type(None) in args else "")
    if origin is tuple:
        return "(" + ", ".join(_type_text(a) for a in args if a is not Ellipsis) + ")"
    if origin is list:
        return f"list of {_type_text(args[0])}" if args else "list"
    if origin is dict:
        return f"map of {_type_text(args[0])} to {_type_text(args[1])}" if args else "map"
    text = getattr(annotation, "__name__", None) or str(annotation)
    return text.replace("typing.", "")


def _bounds(meta: Any) -> str:
    """`Field(ge=1)` / `annotated_types.Ge(1)` as ` >= 1`; anything else says nothing."""
    found = []
    for item in [meta, *getattr(meta, "metadata", [])]:
        for attr, sign in (("ge", ">="), ("gt", ">"), ("le", "<="), ("lt", "<")):
            value = getattr(item, attr, None)
            if isinstance(value, int | float) and not isinstance(value, bool):
                found.append(f"{sign} {value}")
    return " " + ", ".join(dict.fromkeys(found)) if found else ""


def _jsonable(value: Any) -> Any:
    if value is None or isinstance(value, str | int | float | bool):
        return value
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    return str(value)
