"""The runtime's regression watch, built from the config: its store beside the traces, a
shared baseline read through the file-access policy, and the hooks into the outputs and
the profiler."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from appliance.config import ConfigError
from appliance.errors import FileAccessError, LimitError
from appliance.observe.metrics import Metrics
from appliance.policy.files import FileKind, FilePolicy
from appliance.profiling.profiler import Profiler
from appliance.watch.baseline import Baseline, BaselineError, BaselineStore, parse
from appliance.watch.config import WatchConfig
from appliance.watch.probe import Probe
from appliance.watch.rows import Rows
from appliance.watch.watch import Watch, WatchHooks

STORE = Path("watch") / "baselines.json"  # under the process's trace directory


def shared_baseline(config: WatchConfig, files: FilePolicy) -> dict[str, Baseline]:
    """The rows of `profiling.watch.baseline`; ConfigError naming the file and the
    problem when it cannot be read or used."""
    if config.baseline is None:
        return {}
    where = "profiling.watch.baseline"
    try:
        data = files.read_bytes(config.baseline, FileKind.BASELINE, where)
        return parse(json.loads(data), f"{where} ({config.baseline})")
    except (FileAccessError, LimitError) as exc:
        raise ConfigError([f"{where}: {exc}"]) from None
    except (ValueError, BaselineError) as exc:  # JSONDecodeError is a ValueError
        raise ConfigError([f"{where}: {exc}"]) from None


def build_watch(
    config: WatchConfig,
    trace_dir: Path,
    files: FilePolicy,
    metrics: Metrics,
    profiler: Profiler,
    publish: Callable[[list[str] | None, dict[str, Any]], None],
    store_path: Path | None = None,
) -> Watch:
    """The watch (not started); its store at `store_path` (the state folder's, when there
    is one), else at `<trace_dir>/watch/baselines.json`."""
    shared = shared_baseline(config, files)
    store = BaselineStore.open(store_path or trace_dir / STORE, shared)
    watch: Watch

    def open_window(duration_s: float, streams: list[str] | None, ort: bool) -> str:
        return profiler.windows.start(duration_s, streams, ort).id

    def block_model(name: str) -> str | None:
        return watch.block_model(name)

    rows = Rows(
        config.confirm_intervals,
        config.recover_intervals,
        tuple(config.mute),
        metrics,
        publish,
        block_model,
        lambda model: sorted(watch.model_streams().get(model, set())),
        settle_s=config.settle_s,
    )
    hooks = WatchHooks(publish, open_window, lambda: profiler.windows.active)
    watch = Watch(config, store, hooks, rows, Probe(profiler.tracer))
    return watch
