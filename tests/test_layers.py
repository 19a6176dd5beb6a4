"""Imports run one way: pipelines <- sinks <- appliance (aiortc's downward-only stack).

Inside appliance: models <- profiling (runtime instrumentation) <- tools (offline).
"""

from __future__ import annotations

import ast
import subprocess
import sys
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
    "appliance.watch": ("appliance.tools",),
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


# The runtime is the one control interface: the HTTP routes, probes, the server, the CLI
# and sink commands use these of its members and nothing else (its streams, tracer, pool
# and outputs stay its own). Statuses come back as appliance/status.py's dataclasses.
RUNTIME_INTERFACE = frozenset({
    "start", "stop", "stop_streams", "stop_outputs", "prepare", "load_models", "reload",
    "add_stream", "remove_stream", "restart_stream", "has_stream", "unfinished",
    "status", "streams_status", "stream_status", "stream_latency", "stream_regions",
    "models_status", "sinks_status",
    "start_profiling", "profiling_window", "profiling_trace", "regressions", "rebaseline",
    "metrics_text", "sync_metrics", "liveness_problem", "subscribe", "latest",
    "compile_workflow", "compile_stream_workflow", "release_workflow",
    "config", "limits", "request_files", "metrics",
})  # fmt: skip
RUNTIME_USERS = ("appliance/server", "appliance/cli.py", "appliance/client_cli.py",
                 "appliance/headless.py", "appliance/commands.py")  # fmt: skip


def _is_runtime(node: ast.expr) -> bool:
    """`rt`, `runtime`, `self.runtime` or `runtime_of(request)`: how the users name it."""
    if isinstance(node, ast.Name):
        return node.id in ("rt", "runtime")
    if isinstance(node, ast.Attribute):
        return node.attr == "runtime"
    return (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
            and node.func.id == "runtime_of")  # fmt: skip


def runtime_members_used(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return {node.attr for node in ast.walk(tree)
            if isinstance(node, ast.Attribute) and _is_runtime(node.value)}  # fmt: skip


def test_routes_probes_and_the_cli_use_only_the_runtime_interface() -> None:
    paths = [p for user in map(ROOT.joinpath, RUNTIME_USERS)
             for p in ([user] if user.suffix == ".py" else user.rglob("*.py"))]  # fmt: skip
    used = {p.relative_to(ROOT).as_posix(): runtime_members_used(p) for p in paths}
    bad = {path: sorted(names - RUNTIME_INTERFACE) for path, names in used.items()
           if names - RUNTIME_INTERFACE}  # fmt: skip
    assert bad == {}
    assert set().union(*used.values()) >= {"status", "stream_status", "start_profiling"}


def test_the_runtime_interface_exists(tmp_path: Path) -> None:
    from appliance.config import AppConfig
    from appliance.runtime import Runtime

    runtime = Runtime(AppConfig(base_dir=tmp_path))  # built, not started: no thread runs
    assert sorted(n for n in RUNTIME_INTERFACE if not hasattr(runtime, n)) == []


def test_the_cli_starts_without_the_heavy_analysis_libraries() -> None:
    """Every command builds the whole parser; scipy (0.8 s to import) loads only when
    `trace diff` runs, not for `streams list` and the like."""
    code = ("import sys; from appliance.cli import main; "
            "main(['streams', 'list', '--url', 'http://127.0.0.1:9']); "  # refused at once
            "print(sorted(m for m in sys.modules if m.split('.')[0] == 'scipy'))")  # fmt: skip
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=True, cwd=ROOT, timeout=60)  # fmt: skip
    assert done.stdout.strip().splitlines()[-1] == "[]"
