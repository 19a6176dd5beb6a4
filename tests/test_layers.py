"""Imports run one way: pipelines <- sinks <- appliance (aiortc's downward-only stack)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
FORBIDDEN = {
    "pipelines": ("appliance", "sinks", "onnxruntime"),
    "sinks": ("appliance",),
}


def imported_modules(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    names: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.extend(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.append(node.module)
    return names


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_package_does_not_import_upward(package: str) -> None:
    bad = [
        f"{path.relative_to(ROOT)} imports {name}"
        for path in sorted((ROOT / package).rglob("*.py"))
        for name in imported_modules(path)
        if name.split(".")[0] in FORBIDDEN[package]
    ]
    assert bad == []


# Result types, and the one import-string helper every registry shares.
SINKS_MAY_IMPORT = frozenset({"pipelines.types", "pipelines.importer"})


def test_sinks_import_only_result_types_from_pipelines() -> None:
    bad = [
        f"{path.relative_to(ROOT)} imports {name}"
        for path in sorted((ROOT / "sinks").rglob("*.py"))
        for name in imported_modules(path)
        if name.startswith("pipelines") and name not in SINKS_MAY_IMPORT
    ]
    assert bad == []
