"""The watch's verdicts on samples: trace diff's rule when the host is steady, and a host
slowdown told apart from a block's (appliance/watch/judge.py).

Samples are drawn from a seeded lognormal, the shape of span durations (a long right tail),
so each test sees the same numbers every run."""

from __future__ import annotations

import numpy as np

from appliance.tools.regression import SLOWER, Gate, Samples, compare_traces
from appliance.watch.baseline import Baseline, row_key
from appliance.watch.judge import Host, host_speed, judge

GATE = Gate(fail_over_pct=10.0, min_ms=0.2, min_frame_pct=1.0, confidence=0.999)
RNG = np.random.default_rng(7)
PROBE_US = 1000
WAITS = 1100  # ‰: the threads waited 0.1 s for a core per second run, while learning


def spans(median_us: float, n: int = 600) -> np.ndarray:
    return np.rint(RNG.lognormal(np.log(median_us), 0.15, n)).astype(np.int64)


def rows() -> dict[tuple[str, str], float]:
    """A two-stream workflow's rows and their medians (µs)."""
    return {
        ("block", "cam1/detect"): 20_000,
        ("block", "cam1/blur"): 4_000,
        ("block", "cam1/draw"): 1_500,
        ("frame", "cam1"): 26_000,
        ("block", "cam2/detect"): 20_000,
        ("block", "cam2/count"): 800,
        ("frame", "cam2"): 21_000,
        ("model", "faces"): 15_000,
    }


def baselines() -> dict[str, Baseline]:
    probe = np.full(60, PROBE_US, dtype=np.int64)  # the probe's own noise is not under test
    waits = np.full(60, WAITS, dtype=np.int64)
    return {
        row_key(kind, name): Baseline(kind, name, spans(median), probe, 0.0, "learned", waits)
        for (kind, name), median in rows().items()
    }


def recent(scale: dict[str, float], every: float = 1.0) -> dict[str, np.ndarray]:
    """Every row `every` times slower, and the rows in `scale` that much more."""
    return {
        row_key(kind, name): spans(median * every * scale.get(row_key(kind, name), 1.0), 300)
        for (kind, name), median in rows().items()
    }


def verdicts(
    now: dict[str, np.ndarray], probe_factor: float, wait_factor: float = 1.0
) -> tuple[Host, dict[str, str]]:
    base = baselines()
    probe = np.full(10, round(PROBE_US * probe_factor), dtype=np.int64)
    waits = np.full(10, round(WAITS * wait_factor), dtype=np.int64)
    host = host_speed(now, base, probe, waits, GATE, host_pct=10)
    judged = judge(now, base, {"faces": {"cam1"}}, host, GATE)
    return host, {j.key: j.row.verdict for j in judged}


def test_a_steady_host_and_workflow_raise_nothing() -> None:
    host, out = verdicts(recent({}), probe_factor=1.0)
    assert not host.slower and host.factor == 1.0
    assert SLOWER not in out.values()


def test_one_block_slower_is_that_block_alone() -> None:
    host, out = verdicts(recent({"cam1/blur": 1.5}), probe_factor=1.0)
    assert host.factor == 1.0
    slower = {k for k, v in out.items() if v == SLOWER and not k.startswith("frame:")}
    assert slower == {"cam1/blur"}


def test_a_host_slower_as_a_whole_is_the_host_not_every_block() -> None:
    host, out = verdicts(recent({}, every=1.3), probe_factor=1.3)
    assert host.slower and 1.2 < host.factor < 1.4
    assert SLOWER not in out.values()
    # Without the probe's word, the same shift is every block's: the probe is the evidence.
    host, out = verdicts(recent({}, every=1.3), probe_factor=1.0)
    assert not host.slower and out["cam1/detect"] == SLOWER


def test_a_block_much_slower_on_a_slower_host_is_still_found() -> None:
    host, out = verdicts(recent({"cam2/detect": 2.0}, every=1.25), probe_factor=1.25)
    assert host.slower
    slower = {k for k, v in out.items() if v == SLOWER and not k.startswith("frame:")}
    assert slower == {"cam2/detect"}


def test_a_busier_host_that_costs_the_rows_nothing_is_not_a_slowdown() -> None:
    # Another tenant took idle cores: the probe says so, the rows did not move.
    host, out = verdicts(recent({}), probe_factor=1.4)
    assert not host.slower and SLOWER not in out.values()


def test_rows_more_sensitive_than_the_probe_are_excused_by_its_widening() -> None:
    # A neighbour on every core: ONNX Runtime's rows slow more than the probe, Python's less.
    scale = {"cam1/detect": 2.6, "cam2/detect": 2.6, "model:faces": 2.6, "cam1/draw": 1.2}
    host, out = verdicts(recent(scale), probe_factor=2.0)
    assert host.slower and host.factor > 1.8
    assert SLOWER not in out.values()


def test_the_streams_own_contention_swinging_is_not_a_regression() -> None:
    # Saturated cores: the models' runs overlap more for a while; the threads wait longer.
    scale = {"cam1/detect": 1.25, "cam2/detect": 1.25, "model:faces": 1.25}
    host, out = verdicts(recent(scale), probe_factor=1.0, wait_factor=1.25)
    assert not host.slower and host.factor == 1.25  # not the host: the streams' own
    assert SLOWER not in out.values()
    # ... while a block that got heavier stands out of the contention it causes.
    host, out = verdicts(recent({**scale, "cam1/detect": 1.9}), 1.0, wait_factor=1.25)
    assert {k for k, v in out.items() if v == SLOWER and "frame" not in k} == {"cam1/detect"}


def test_a_faster_host_excuses_nothing() -> None:
    # Learned under load, watched on a quiet host: a block that got heavier is still found.
    host, out = verdicts(recent({"cam1/blur": 1.5}, every=0.8), probe_factor=0.7)
    assert host.factor == 1.0 and out["cam1/blur"] == SLOWER
    assert out["cam1/detect"] != SLOWER


def test_with_a_steady_host_the_verdicts_are_trace_diffs() -> None:
    now = recent({"cam1/blur": 1.3, "cam2/count": 1.2})
    base = baselines()
    _, out = verdicts(now, probe_factor=1.0)
    before, after = Samples(), Samples()
    for key, b in base.items():
        before.rows[(b.kind, b.name)] = b.samples.tolist()
        after.rows[(b.kind, b.name)] = now[key].tolist()
    before.model_streams["faces"] = {"cam1"}
    diff = {row_key(r.kind, r.name): r.verdict for r in compare_traces(before, after, GATE)}
    assert diff == out
    assert out["cam1/blur"] == SLOWER
    assert out["cam2/count"] == "immaterial"  # +0.16 ms: under min_ms
