"""A stream too slow to fill an interval (a camera at a few fps, a block gated to run
rarely) is still judged: its samples are held until enough came, and judged together."""

from __future__ import annotations

from typing import Any

import numpy as np

from appliance.observe.metrics import Metrics
from appliance.watch.baseline import Baseline, BaselineStore, row_key
from appliance.watch.config import WatchConfig
from appliance.watch.ranktest import MIN_SAMPLES
from appliance.watch.recorder import SKIPPED
from appliance.watch.rows import Rows
from appliance.watch.watch import Watch, WatchHooks

BASE_US = 10_000  # the block's baseline: 10 ms
SLOW_US = 40_000  # four times slower


def sparse_watch() -> tuple[Watch, list[dict[str, Any]]]:
    """A watch on one stream `cam` with a learned baseline for its block `det`."""
    published: list[dict[str, Any]] = []
    config = WatchConfig(interval_s=1, warmup_s=0, learn_s=1)
    store = BaselineStore(None)
    rng = np.random.default_rng(7)
    samples = (BASE_US + rng.integers(-500, 500, 200)).astype(np.int64)
    store.put([Baseline("block", "cam/det", samples, np.empty(0, np.int64), 0.0, "learned")])
    hooks = WatchHooks(lambda _s, doc: published.append(doc), lambda *_: "w1", lambda: False)
    rows = Rows(1, 2, (), Metrics(), hooks.publish, lambda _n: None, lambda _m: [])
    watch = Watch(config, store, hooks, rows)
    watch.attach("cam", ("det",), {})
    return watch, published


def frames(watch: Watch, n: int, block_us: int) -> None:
    ring = watch._streams["cam"].recorder.ring
    for _ in range(n):
        ring.put((block_us + 1000, block_us + 2000, block_us, SKIPPED))  # no CPU clock


def verdicts(watch: Watch) -> dict[str, str | None]:
    return {r.name: r.verdict for r in watch.stream_status("cam").rows}


def test_an_interval_with_too_few_samples_is_held_and_judged_with_the_next() -> None:
    watch, published = sparse_watch()
    few = MIN_SAMPLES // 2 + 1  # each interval alone too few; two together enough
    frames(watch, few, SLOW_US)
    watch.compare()
    assert watch.rows.comparisons == 0  # nothing judged yet: not a verdict on 6 frames
    frames(watch, few, SLOW_US)
    watch.compare()
    assert verdicts(watch)["cam/det"] == "slower"
    raised = [d for d in published if d["type"] == "regression_started"]
    assert [d["regression"]["name"] for d in raised] == ["cam/det"]


def test_held_samples_of_a_restarted_workflow_are_forgotten() -> None:
    watch, _ = sparse_watch()
    frames(watch, MIN_SAMPLES - 1, SLOW_US)
    watch.compare()
    watch.attach("cam", ("det",), {})  # restarted: the held frames were the old workflow's
    frames(watch, MIN_SAMPLES - 1, BASE_US)
    watch.compare()
    assert watch.rows.comparisons == 0
    frames(watch, 1, BASE_US)
    watch.compare()
    assert verdicts(watch)["cam/det"] == "ok"
    assert row_key("block", "cam/det") not in watch._held
