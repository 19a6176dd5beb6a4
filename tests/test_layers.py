"""Imports run one way: pipelines <- sinks <- appliance (aiortc's downward-only stack).

Inside appliance: models <- profiling (runtime instrumentation) <- tools (offline).
"""

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


# The models know nothing of profiling: the runtime injects the per-batch hook. The runtime
# instrumentation knows nothing of the offline tools (trace summarize/diff, fingerprint,
# model bench), which may import it.
APPLIANCE_FORBIDDEN = {
    "appliance.models": ("appliance.profiling", "appliance.tools"),
    "appliance.profiling": ("appliance.tools",),
}


def is_within(name: str, package: str) -> bool:
    return name == package or name.startswith(package + ".")


@pytest.mark.parametrize("package", sorted(APPLIANCE_FORBIDDEN))
def test_appliance_layer_does_not_import_upward(package: str) -> None:
    bad = [
        f"{path.relative_to(ROOT)} imports {name}"
        for path in sorted(ROOT.joinpath(*package.split(".")).rglob("*.py"))
        for name in imported_modules(path)
        if any(is_within(name, up) for up in APPLIANCE_FORBIDDEN[package])
    ]
    assert bad == []


# The offline tools load only for their commands: the serving process never imports them.
TOOLS_IMPORTED_BY = frozenset({Path("appliance/cli.py")})


def test_only_the_cli_imports_the_offline_tools() -> None:
    tools = ROOT / "appliance" / "tools"
    bad = [
        f"{path.relative_to(ROOT)} imports {name}"
        for path in sorted((ROOT / "appliance").rglob("*.py"))
        if tools not in path.parents and path.relative_to(ROOT) not in TOOLS_IMPORTED_BY
        for name in imported_modules(path)
        if is_within(name, "appliance.tools")
    ]
    assert bad == []
