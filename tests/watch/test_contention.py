"""Culprits and victims (appliance/watch/contention.py), on the real watch with rings
filled as streams would fill them: a row whose own cost per run (CPU) grew is raised; a
row whose latency alone grew waited, and is contention with the culprit named; after a
change of load its victims are that change's, and learn again once it settled. A
baseline learned over intervals that drifted allows that drift (judge.py)."""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from appliance.models.batches import BatchRecord
from appliance.observe.metrics import Metrics
from appliance.watch.baseline import Baseline, BaselineStore, Learning
from appliance.watch.config import WatchConfig
from appliance.watch.contention import Contention
from appliance.watch.judge import Host, judge
from appliance.watch.report import Change
from appliance.watch.rows import Rows
from appliance.watch.rule import Gate
from appliance.watch.watch import Watch, WatchHooks

BASE_US = 10_000  # each block's baseline: 10 ms, all of it its own CPU
N = 200  # frames an interval
EMPTY = np.empty(0, np.int64)
GATE = Gate(fail_over_pct=25, min_ms=0.2, min_frame_pct=1.0, confidence=0.999)


def spans(median: int, seed: int, n: int = N) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return (median * (1 + 0.02 * rng.standard_normal(n))).astype(np.int64)


def watched(settle_s: float = 3600.0) -> tuple[Watch, list[dict[str, Any]]]:
    """A watch on `cam` (blocks `det` and `blur`) with baselines of latency and own cost
    learned at BASE_US each."""
    published: list[dict[str, Any]] = []
    config = WatchConfig(interval_s=1, warmup_s=0, learn_s=1, settle_s=settle_s)
    store = BaselineStore(None)
    rows_kept = [
        Baseline("block", f"cam/{b}", spans(BASE_US, i), EMPTY, 0.0, "learned",
                 cpu=spans(BASE_US, 10 + i))
        for i, b in enumerate(("det", "blur"))
    ]  # fmt: skip
    frame = Baseline("frame", "cam", spans(2 * BASE_US + 500, 9), EMPTY, 0.0, "learned")
    store.put([*rows_kept, frame])
    hooks = WatchHooks(lambda _s, doc: published.append(doc), lambda *_: "w1", lambda: False)
    rows = Rows(1, 2, (), Metrics(), hooks.publish, lambda _n: None, lambda _m: [])
    rows.settle_s = settle_s
    watch = Watch(config, store, hooks, rows)
    watch.attach("cam", ("det", "blur"), {})
    return watch, published


def frames(watch: Watch, det: tuple[int, int], blur: tuple[int, int], seed: int = 1) -> None:
    """N frames: each block's (latency µs, own CPU µs) medians."""
    ring = watch._streams["cam"].recorder.ring
    cols = [spans(det[0], seed), spans(blur[0], seed + 1), spans(det[1], seed + 2),
            spans(blur[1], seed + 3)]  # fmt: skip
    for i in range(N):
        lat_det, lat_blur, cpu_det, cpu_blur = (int(c[i]) for c in cols)
        ring.put((lat_det + lat_blur + 500, 30_000, lat_det, lat_blur, cpu_det, cpu_blur))


def of_type(published: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [d for d in published if d["type"] == kind]


def verdicts(watch: Watch) -> dict[str, str | None]:
    return {r.name: r.verdict for r in watch.stream_status("cam").rows}


def test_the_block_whose_own_cost_grew_is_raised_and_the_one_that_waited_is_its_victim() -> None:
    watch, published = watched()
    # det does three times the work; blur does the same work but waits twice as long.
    frames(watch, det=(3 * BASE_US, 3 * BASE_US), blur=(2 * BASE_US, BASE_US))
    watch.compare()
    raised = [d["regression"] for d in of_type(published, "regression_started")]
    assert [r["name"] for r in raised] == ["cam/det"]
    assert raised[0]["own_ratio"] > 2.5
    assert verdicts(watch)["cam/blur"] == "contention"
    [event] = of_type(published, "contention")
    assert [v["name"] for v in event["contention"]["rows"]] == ["cam/blur"]
    assert event["contention"]["culprits"] == ["cam/det"]
    assert event["contention"]["rows"][0]["own_ratio"] < 1.1
    [kept] = watch.report().contention  # GET /v1/regressions keeps it
    assert kept.type == "contention" and kept.culprits == ["cam/det"]


def test_without_its_own_cost_a_slower_row_is_raised_as_before() -> None:
    """A baseline with no own cost (a trace file's) judges latency alone."""
    watch, published = watched()
    for key in ("cam/det", "cam/blur"):
        base = watch.store.rows[key]
        watch.store.rows[key] = Baseline(base.kind, base.name, base.samples, EMPTY, 0.0, "file")
    frames(watch, det=(BASE_US, BASE_US), blur=(2 * BASE_US, BASE_US))
    watch.compare()
    raised = [d["regression"]["name"] for d in of_type(published, "regression_started")]
    assert raised == ["cam/blur"]
    assert of_type(published, "contention") == []


def test_victims_of_a_change_of_load_are_its_and_learn_again_once_it_settled() -> None:
    watch, published = watched()
    watch.changed("stream added", "stream 'cam-2' added")
    frames(watch, det=(2 * BASE_US, BASE_US), blur=(2 * BASE_US, BASE_US))
    watch.compare()
    assert of_type(published, "regression_started") == []
    [event] = of_type(published, "load_changed")
    assert event["load_changed"]["change"]["summary"] == "stream 'cam-2' added"
    assert {v["name"] for v in event["load_changed"]["rows"]} == {"cam/det", "cam/blur"}
    assert {v["name"]: v["ratio"] > 1.8 for v in event["load_changed"]["rows"]} == {
        "cam/det": True,
        "cam/blur": True,
    }
    assert watch.store.get("cam/det") is not None  # not settled yet: kept
    watch.rows.settle_s = 0.0  # the change has settled
    frames(watch, det=(2 * BASE_US, BASE_US), blur=(2 * BASE_US, BASE_US), seed=5)
    watch.compare()
    assert watch.store.get("cam/det") is None and watch.store.get("cam/blur") is None
    assert of_type(published, "regression_started") == []
    frames(watch, det=(2 * BASE_US, BASE_US), blur=(2 * BASE_US, BASE_US), seed=9)
    watch.compare()  # learn_s is 1 s: the new load is learned from here
    states = {r.name: r.state for r in watch.stream_status("cam").rows}
    assert states["cam/det"] == states["cam/blur"] == "learning"


def test_a_baseline_learned_over_drifting_intervals_allows_that_drift() -> None:
    learning = Learning(0.0)
    for i, median in enumerate((10_000, 13_000, 10_500, 12_800)):  # a machine's two states
        learning.add(spans(median, i), 20_000, spans(median, 50 + i))
    spread, cpu_spread = learning.spreads()
    assert 1.25 < spread < 1.35 and 1.25 < cpu_spread < 1.35
    host = Host(None, None, 0, 1.0, 0.0, False)
    now = {"cam/det": spans(16_000, 99)}  # 1.45 times the fast state
    for kept, raised in ((spread, False), (1.0, True)):
        base = Baseline(
            "block", "cam/det", spans(11_000, 7, 1000), EMPTY, 0.0, "learned", spread=kept
        )
        [row] = judge(now, {"cam/det": base}, {}, host, GATE)
        assert (row.row.verdict == "slower") is raised, (kept, row.row)


def test_a_block_is_raised_with_its_model_when_the_model_did_more_work() -> None:
    """A detector block's own cost leaves its model's run out: it is raised with the
    model when the model's own cost grew, and a victim when the model only waited."""
    for model_cpu, block_raised in ((3 * BASE_US, True), (BASE_US, False)):
        watch, published = watched()
        watch.rows.block_models = lambda name: "m" if name == "cam/det" else None
        watch.attach("cam", ("det", "blur"), {"det": "m"})
        model = Baseline("model", "m", spans(BASE_US, 20), EMPTY, 0.0, "learned",
                         cpu=spans(BASE_US, 21))  # fmt: skip
        watch.store.put([model])
        watch.models._first_batch("m", 0.0)
        watch.models.skip_until["m"] = 0.0
        for run, cpu in zip(spans(3 * BASE_US, 22), spans(model_cpu, 23), strict=True):
            watch.models(BatchRecord("m", 1, ("cam",), (0.0,), time.perf_counter(), run / 1e6,
                                     cpu_s=cpu / 1e6))  # fmt: skip
        # The block waits for its model's run: its latency grows, its own cost does not.
        frames(watch, det=(3 * BASE_US, BASE_US), blur=(BASE_US, BASE_US))
        watch.compare()
        raised = {d["regression"]["name"] for d in of_type(published, "regression_started")}
        assert ("cam/det" in raised) is block_raised, (model_cpu, raised)
        assert ("model:m" in raised) is block_raised
        assert (verdicts(watch)["cam/det"] == "contention") is not block_raised


def test_rows_a_change_of_load_slowed_within_the_waits_are_its_victims() -> None:
    """Two cameras added to a saturated machine: every thread waits 60 % longer, and the
    rows' latency grows as much. The waits explain it, so nothing is slower once they are
    taken out, but the rows did move: after a change of load they are that change's
    victims (named, and learned again once it settles), without one they are nothing, and
    a row whose own cost grew is never one."""
    base = {
        f"cam/{b}": Baseline("block", f"cam/{b}", spans(BASE_US, i), EMPTY, 0.0, "learned",
                             cpu=spans(BASE_US, 10 + i))
        for i, b in enumerate(("det", "blur"))
    }  # fmt: skip
    now = {"cam/det": spans(16_000, 30), "cam/blur": spans(16_000, 31)}
    own = {"cam/det": spans(BASE_US, 32), "cam/blur": spans(BASE_US, 33)}
    host = Host(None, None, 0, 1.6, 60.0, False, wait_ratio=1.6)
    judged = judge(now, base, {}, host, GATE, own)
    assert [j.row.verdict for j in judged] == ["ok", "ok"]
    assert all(j.excused and 1.5 < j.raw_ratio < 1.7 for j in judged)
    contention = Contention()
    assert contention.judge(judged, False) == set()  # no change of load: the waits' swing
    victims = contention.judge(judged, True, after_change=lambda _key: True)
    assert victims == {"cam/det", "cam/blur"}
    event = contention.event(victims, judged, [], Change("stream added", "t", "cam-2"), host)
    assert event is not None and event.type == "load_changed"
    assert {v.name: v.ratio > 1.5 for v in event.rows} == {"cam/det": True, "cam/blur": True}
    # A row that did more work as well is no change's victim: twice the work on top of
    # the waits passes the gate they widened, and it is raised.
    own["cam/det"] = spans(2 * BASE_US, 34)
    now["cam/det"] = spans(32_000, 35)
    judged = judge(now, base, {}, host, GATE, own)
    by_key = {j.key: j for j in judged}
    assert by_key["cam/det"].slower and not by_key["cam/det"].excused
    assert contention.judge(judged, True, after_change=lambda _key: True) == {"cam/blur"}


def test_rows_a_change_of_load_slowed_learn_again_once_it_settled() -> None:
    base = {
        "cam/det": Baseline("block", "cam/det", spans(BASE_US, 1), EMPTY, 0.0, "learned",
                            cpu=spans(BASE_US, 2))
    }  # fmt: skip
    published: list[dict[str, Any]] = []
    rows = Rows(1, 2, (), Metrics(), lambda _s, doc: published.append(doc), lambda _n: None,
                lambda _m: [])  # fmt: skip
    host = Host(None, None, 0, 1.6, 60.0, False, wait_ratio=1.6)

    def compare(seed: int) -> None:
        now, own = {"cam/det": spans(16_000, seed)}, {"cam/det": spans(BASE_US, seed + 1)}
        assert rows.apply(judge(now, base, {}, host, GATE, own), host, base, {"cam"}) == []

    compare(40)  # the waits swing with no change of load: not the rows' business
    assert published == [] and rows.settled_victims(base) == []
    rows.changed("stream added", "stream 'cam-2' added")
    compare(42)
    [event] = of_type(published, "load_changed")
    assert [v["name"] for v in event["load_changed"]["rows"]] == ["cam/det"]
    assert rows.settled_victims(base) == []  # not settled yet
    rows.settle_s = 0.0
    compare(44)
    assert rows.settled_victims(base) == ["cam/det"]  # the watch learns it again


def test_a_queue_wait_that_grew_while_its_model_did_not_is_contention_never_raised() -> None:
    """A queue wait is only waiting: for the model's runs (the model row) and the other
    samples of its batch. Longer waits with the runs unchanged are the streams' arrivals
    lining up differently with the batches, reported as contention, never raised, even
    when they last; the frame age stays judged as before."""
    watch, published = watched()
    watch.attach("cam", ("det", "blur"), {"det": "m"})
    watch.store.put([
        Baseline("model", "m", spans(BASE_US, 20), EMPTY, 0.0, "learned", cpu=spans(BASE_US, 21)),
        Baseline("queue", "m", spans(BASE_US, 24), EMPTY, 0.0, "learned"),
    ])  # fmt: skip
    watch.models._first_batch("m", 0.0)
    watch.models.skip_until["m"] = 0.0
    for interval in range(4):  # past confirm + 1 intervals: when an echo would be raised
        waits = spans(3 * BASE_US, 30 + interval)
        for run, wait in zip(spans(BASE_US, 40 + interval), waits, strict=True):
            watch.models(BatchRecord("m", 1, ("cam",), (wait / 1e6,), time.perf_counter(),
                                     run / 1e6, cpu_s=run / 1e6))  # fmt: skip
        frames(watch, det=(BASE_US, BASE_US), blur=(BASE_US, BASE_US), seed=50 + interval)
        watch.compare()
    assert of_type(published, "regression_started") == []
    [event] = of_type(published, "contention")  # once: it stayed a victim
    [row] = event["contention"]["rows"]
    assert row["name"] == "queue:m" and row["ratio"] > 2.5
    assert event["contention"]["culprits"] == []
    [kept] = watch.report().contention  # GET /v1/regressions keeps it
    assert [v.name for v in kept.rows] == ["queue:m"]


def test_a_block_that_runs_another_model_than_it_learned_with_is_raised_not_a_victim() -> None:
    """A shadow promoted: `det` learned with model `small` now runs `large`. Its latency
    tripled while its own cost (the model's runs left out) did not move: with the same
    model that is waiting (a victim); with another model, it is the block's own doing."""
    for learned_with, raised in (("small", ["cam/det"]), ("large", [])):
        watch, published = watched()
        base = watch.store.rows["cam/det"]
        watch.store.rows["cam/det"] = Baseline(
            base.kind, base.name, base.samples, EMPTY, 0.0, "learned", cpu=base.cpu,
            model=learned_with,
        )  # fmt: skip
        watch.rows.block_models = watch.block_model
        watch.attach("cam", ("det", "blur"), {"det": "large"})
        frames(watch, det=(3 * BASE_US, BASE_US), blur=(BASE_US, BASE_US))
        watch.compare()
        names = [d["regression"]["name"] for d in of_type(published, "regression_started")]
        assert names == raised, learned_with
        assert (verdicts(watch)["cam/det"] == "contention") is not bool(raised)
