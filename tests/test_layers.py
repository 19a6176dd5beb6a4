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
#
# The rooms of appliance/, bottom to top: policy and sources (what may be reached, how
# frames arrive) <- models, observe, profiling, watch <- runtime (what runs) <- tune (it
# drives a runtime) <- server (the API over a runtime) <- workers (N servers behind one)
# <- cli (the command; only __main__ imports it). tools are offline and imported by the
# cli alone (below). A room never imports one above it.
ABOVE_RUNTIME = (
    "appliance.runtime",
    "appliance.tune",
    "appliance.server",
    "appliance.workers",
    "appliance.cli",
    "appliance.tools",
)
APPLIANCE_FORBIDDEN = {
    "appliance.policy": ABOVE_RUNTIME,
    # Sources own their config (appliance/sources/config.py); the config file imports it.
    "appliance.sources": (
        *ABOVE_RUNTIME,
        "appliance.models",
        "appliance.profiling",
        "appliance.config",
    ),
    "appliance.models": (*ABOVE_RUNTIME, "appliance.profiling", "appliance.watch"),
    "appliance.observe": ABOVE_RUNTIME,
    "appliance.profiling": ABOVE_RUNTIME,
    "appliance.watch": ABOVE_RUNTIME,
    "appliance.runtime": ABOVE_RUNTIME[1:],
    "appliance.tune": ABOVE_RUNTIME[2:],
    "appliance.server": ABOVE_RUNTIME[3:],
    "appliance.workers": ABOVE_RUNTIME[4:],
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


def test_only_main_imports_the_cli() -> None:
    bad = [
        f"{path.relative_to(ROOT)} imports {name}"
        for path in sorted((ROOT / "appliance").rglob("*.py"))
        if ROOT / "appliance" / "cli" not in path.parents and path.name != "__main__.py"
        for name in imported_modules(path)
        if is_within(name, "appliance.cli")
    ]
    assert bad == []


def import_graph() -> dict[str, set[str]]:
    """Module -> the project modules it imports anywhere in its text (at the top, inside a
    function, under TYPE_CHECKING: a circle through any of them is still a circle)."""
    paths = {
        ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__"): path
        for package in ("appliance", "sinks", "pipelines")
        for path in (ROOT / package).rglob("*.py")
    }
    graph: dict[str, set[str]] = {}
    for module, path in paths.items():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        names: set[str] = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names.update([node.module, *(f"{node.module}.{a.name}" for a in node.names)])
            elif isinstance(node, ast.Import):
                names.update(alias.name for alias in node.names)
        # A package's own __init__ is imported on the way to its modules: not an edge.
        graph[module] = {n for n in names if n in paths and not module.startswith(n + ".")}
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The graph's strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in sorted(graph[node]):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = stack[stack.index(node) :]
            del stack[stack.index(node) :]
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_circles_are_found() -> None:
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert circles({"a": {"b"}, "b": set()}) == []


def test_no_module_imports_itself_back() -> None:
    """No import circle, even through a lazy or TYPE_CHECKING import: a module that needs
    its caller's type takes a Protocol, or the caller passes what it needs."""
    assert circles(import_graph()) == []


# The offline tools load only for their commands: the serving process never imports them.
TOOLS_IMPORTED_BY = frozenset({Path("appliance/cli/main.py")})


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
# and outputs stay its own). Statuses come back as appliance/observe/status.py's dataclasses.
RUNTIME_INTERFACE = frozenset({
    "start", "stop", "stop_streams", "stop_outputs", "prepare", "load_models", "reload",
    "add_stream", "remove_stream", "restart_stream", "has_stream", "unfinished",
    "status", "streams_status", "stream_status", "stream_latency", "stream_regions",
    "slowest_frames", "frame_trace",
    "models_status", "sinks_status", "hold_video", "lease_video",
    "start_profiling", "profiling_window", "profiling_trace", "regressions", "rebaseline",
    "metrics_text", "sync_metrics", "liveness_problem", "subscribe", "latest",
    "compile_workflow", "compile_stream_workflow", "release_workflow",
    "config", "limits", "request_files", "metrics", "audit", "shadows",
})  # fmt: skip
RUNTIME_USERS = ("appliance/server", "appliance/cli/main.py", "appliance/cli/client.py",
                 "appliance/cli/headless.py", "appliance/runtime/commands.py")  # fmt: skip


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
    from appliance.runtime.runtime import Runtime

    runtime = Runtime(AppConfig(base_dir=tmp_path))  # built, not started: no thread runs
    assert sorted(n for n in RUNTIME_INTERFACE if not hasattr(runtime, n)) == []


def test_the_cli_starts_without_the_heavy_analysis_libraries() -> None:
    """Every command builds the whole parser; scipy (0.8 s to import) loads only when
    `trace diff` runs, not for `streams list` and the like."""
    code = ("import sys; from appliance.cli.main import main; "
            "main(['streams', 'list', '--url', 'http://127.0.0.1:9']); "  # refused at once
            "print(sorted(m for m in sys.modules if m.split('.')[0] == 'scipy'))")  # fmt: skip
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=True, cwd=ROOT, timeout=60)  # fmt: skip
    assert done.stdout.strip().splitlines()[-1] == "[]"
