"""The regression watch's evidence and a reload's model (appliance/watch/watch.py), on a
watch fed by hand: a block raised an interval after its model, while the window opened for
the model still records, is linked to that window (one window runs at a time: a second
could not open); a model reloaded is judged on its own runs, not on those the rings held
from before."""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from appliance.models.batches import BatchRecord
from appliance.observe.metrics import Metrics
from appliance.watch.baseline import Baseline, BaselineStore
from appliance.watch.config import WatchConfig
from appliance.watch.ranktest import MIN_SAMPLES
from appliance.watch.recorder import SKIPPED
from appliance.watch.rows import Rows
from appliance.watch.watch import Watch, WatchHooks

BASE_US = 10_000  # the block's and its model's baselines: 10 ms
SLOW_US = 40_000  # four times slower


class Windows:
    """The profiler's side of the hooks: one window at a time, each one's streams and ORT."""

    def __init__(self) -> None:
        self.opened: list[tuple[list[str] | None, bool]] = []

    def open(self, _duration_s: float, streams: list[str] | None, ort: bool) -> str:
        if self.opened:  # it records on: as WindowBusyError
            raise RuntimeError(f"window w{len(self.opened)} is running")
        self.opened.append((streams, ort))
        return f"w{len(self.opened)}"


def watched() -> tuple[Watch, Windows, list[dict[str, Any]]]:
    """A watch on stream `cam`, whose block `det` runs model `m`, both with a baseline."""
    published: list[dict[str, Any]] = []
    windows = Windows()
    store = BaselineStore(None)
    rng = np.random.default_rng(7)
    empty = np.empty(0, np.int64)
    for kind, name in (("block", "cam/det"), ("model", "m")):
        samples = (BASE_US + rng.integers(-500, 500, 200)).astype(np.int64)
        store.put([Baseline(kind, name, samples, empty, 0.0, "learned")])
    hooks = WatchHooks(lambda _s, doc: published.append(doc), windows.open, lambda: False)
    rows = Rows(1, 2, (), Metrics(), hooks.publish, lambda _n: "m", lambda _m: ["cam"])
    watch = Watch(WatchConfig(interval_s=1, warmup_s=0, learn_s=60), store, hooks, rows)
    watch.attach("cam", ("det",), {"det": "m"})
    runs(watch, 1, BASE_US)  # the model's first batch: its warm-up starts (not recorded)
    return watch, windows, published


def runs(watch: Watch, n: int, run_us: int) -> None:
    for _ in range(n):
        watch.models(BatchRecord("m", 1, ("cam",), (0.0,), time.perf_counter(), run_us / 1e6))


def frames(watch: Watch, n: int, block_us: int) -> None:
    ring = watch._streams["cam"].recorder.ring
    for _ in range(n):
        ring.put((block_us + 1000, block_us + 2000, block_us, SKIPPED))  # no CPU clock


def started(published: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    raised = [d["regression"] for d in published if d["type"] == "regression_started"]
    return {r["name"]: r for r in raised}


def test_a_block_raised_while_its_models_window_records_is_linked_to_it() -> None:
    watch, windows, published = watched()
    runs(watch, MIN_SAMPLES, SLOW_US)  # the model: enough to judge
    frames(watch, MIN_SAMPLES - 1, SLOW_US)  # its block: one frame short, still running
    watch.compare()
    assert set(started(published)) == {"model:m"}
    frames(watch, 1, SLOW_US)  # that frame, done after the comparison took the ring
    watch.compare()
    raised = started(published)
    assert set(raised) == {"model:m", "cam/det"}
    evidence = {"window": "w1", "trace": "/v1/profiling/w1/trace", "ort_operators": True}
    assert raised["cam/det"]["evidence"] == raised["model:m"]["evidence"] == evidence
    assert windows.opened == [(["cam"], True)]


def test_a_reloaded_model_is_judged_on_its_own_runs() -> None:
    watch, _, published = watched()
    runs(watch, MIN_SAMPLES, BASE_US)  # before the reload; no comparison took them yet
    watch.changed("reload", "models.m changed")
    runs(watch, MIN_SAMPLES, SLOW_US)  # the model loaded anew
    watch.compare()
    model = started(published)["model:m"]
    assert model["current_p50_ms"] == SLOW_US / 1000  # not a median of both models' runs
