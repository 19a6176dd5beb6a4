"""The watch's verdicts on samples: trace diff's rule when the host is steady, and a host
slowdown told apart from a block's (appliance/watch/judge.py).

Samples are drawn from a seeded lognormal, the shape of span durations (a long right tail),
so each test sees the same numbers every run."""

from __future__ import annotations

import numpy as np

from appliance.tools.regression import SLOWER, Gate, Samples, compare_traces
from appliance.watch.baseline import Baseline, row_key
from appliance.watch.judge import Host, Judged, host_speed, judge

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


def baselines(cpu: bool = False) -> dict[str, Baseline]:
    """Every row's baseline; with `cpu`, its own cost too (a tenth less than its latency)."""
    probe = np.full(60, PROBE_US, dtype=np.int64)  # the probe's own noise is not under test
    waits = np.full(60, WAITS, dtype=np.int64)
    out = {}
    for (kind, name), median in rows().items():
        own = spans(0.9 * median) if cpu and kind != "frame" else np.empty(0, np.int64)
        out[row_key(kind, name)] = Baseline(
            kind, name, spans(median), probe, 0.0, "learned", waits, own, probe_cpu=probe
        )
    return out


def recent(scale: dict[str, float], every: float = 1.0) -> dict[str, np.ndarray]:
    """Every row `every` times slower, and the rows in `scale` that much more."""
    return {
        row_key(kind, name): spans(median * every * scale.get(row_key(kind, name), 1.0), 300)
        for (kind, name), median in rows().items()
    }


def measured(
    now: dict[str, np.ndarray],
    probe_factor: float,
    wait_factor: float = 1.0,
    core_factor: float | None = None,
    own: dict[str, np.ndarray] | None = None,
) -> tuple[Host, list[Judged]]:
    """The comparison: `probe_factor` the probe's host µs now over learned, `core_factor`
    its CPU µs alone (the same by default: a slower core), `own` each row's own cost."""
    base = baselines(cpu=own is not None)
    probe = np.full(10, round(PROBE_US * probe_factor), dtype=np.int64)
    core = np.full(10, round(PROBE_US * (core_factor or probe_factor)), dtype=np.int64)
    waits = np.full(10, round(WAITS * wait_factor), dtype=np.int64)
    host = host_speed(now, base, (probe, core), waits, GATE, host_pct=10)
    judged = judge(now, base, {"faces": {"cam1"}}, host, GATE, own)
    return host, judged


def verdicts(
    now: dict[str, np.ndarray], probe_factor: float, wait_factor: float = 1.0
) -> tuple[Host, dict[str, str]]:
    host, judged = measured(now, probe_factor, wait_factor)
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


def own_costs(scale: dict[str, float]) -> dict[str, np.ndarray]:
    """Each row's own cost now: its baseline's (0.9 of its latency), the rows in `scale`
    that much more."""
    return {
        row_key(kind, name): spans(0.9 * median * scale.get(row_key(kind, name), 1.0), 300)
        for (kind, name), median in rows().items()
        if kind != "frame"
    }


def test_a_neighbour_that_leaves_us_fewer_cores_does_not_excuse_own_cost() -> None:
    # The probe takes twice as long by the wall (half the machine is another tenant's)
    # while its CPU time did not move: the cores are as fast, so a row's own cost is judged
    # as it stands, and the blur block's, 1.6 times its baseline, grew.
    scale = {"cam1/detect": 2.0, "cam2/detect": 2.0, "model:faces": 2.0, "cam1/blur": 3.2}
    host, judged = measured(
        recent(scale), 2.0, core_factor=1.0, own=own_costs({"cam1/blur": 1.6})
    )  # fmt: skip
    assert host.factor == 2.0 and host.cpu_factor == 1.0 and host.probe_cpu_ratio == 1.0
    grew = {j.key for j in judged if j.grew}
    assert grew == {"cam1/blur"}, [(j.key, j.own, j.own_ratio) for j in judged]
    # A slower core (the probe's CPU time grew as much) excuses the same growth.
    host, judged = measured(recent(scale), 2.0, own=own_costs({"cam1/blur": 1.6}))
    assert host.cpu_factor == 2.0
    assert not [j.key for j in judged if j.grew]


def test_a_slow_state_the_probe_under_reads_raises_nothing() -> None:
    # The machine's slow state: the models' latency moved ×1.8 and their own cost ×1.6,
    # while the probe reads ×1.08 by the wall and ×1.05 by its CPU time (ONNX Runtime's
    # kernels feel the state more than the probe's small model), and the threads wait
    # 60 % longer. The own costs grew; every row's latency is still judged with the whole
    # factor, so none is raised (as a culprit judged without the waits, the model was).
    scale = {k: 1.8 for k in ("cam1/detect", "cam2/detect", "model:faces", "cam1/blur")}
    own = own_costs({k: 1.6 for k in scale})
    host, judged = measured(recent(scale), 1.08, wait_factor=1.6, core_factor=1.05, own=own)
    assert not host.slower and host.factor == 1.6 and host.cpu_factor == 1.0
    assert {"model:faces", "cam1/blur"} <= {j.key for j in judged if j.grew}
    assert not [j.key for j in judged if j.slower], [(j.key, j.row.verdict) for j in judged]
