"""One comparison of the regression watch: each row's recent samples against its baseline,
with `trace diff`'s rule (appliance/watch/rule.py: material in ms and in share of the
frame, significant by the Mann–Whitney U test, the Hodges–Lehmann shift with its
interval), after what the machine explains is taken out.

Three things slow many rows at once, none of them a row's own regression, each with its
measure (probe.py), now against while the row was learned:

- a slower CPU (frequency, throttling) and a busier machine (another tenant, a noisy
  neighbour, a VM's steal): the probe, a fixed loop's CPU time over the share of the
  machine other processes leave us. Our own work never moves it. This is the host;
- contention among the streams' own threads: how long they waited for a core per second
  run. On a saturated machine it swings by tens of % with nothing changed (the streams'
  models overlap more or less as their frames drift in and out of phase), and a noisy
  neighbour raises it too.

The factor is the larger of the two ratios when it passes a margin (half of `host_pct`),
else 1: a machine faster than at learning excuses nothing. Each row is judged on its
samples divided by the factor, with the gate's `fail_over_pct` widened by as much again:
rows do not all slow alike (ONNX Runtime's threads wait for each other when one of them
waits for a core; a Python block barely notices), so a machine 40 % slower must leave a
row 40 % beyond what it explains. A heavier block is still found: its own work grew, and
the contention it adds for the others excuses them, not it. With a factor of 1 this is
exactly `trace diff --fail-over`.

The host is reported slower when the probe passes `host_pct` and the median CPU row (the
common shift: blocks and models of at least `min_ms`, each its median now over its
baseline's) moved too: a busier machine that costs the streams nothing is not an alert.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping
from dataclasses import dataclass, replace

import numpy as np

from appliance.watch.baseline import Baseline
from appliance.watch.baseline import Samples as Values
from appliance.watch.ranktest import MIN_SAMPLES
from appliance.watch.rule import Gate, Row, Samples, compare_row

CPU_KINDS = ("block", "model")  # rows whose time is CPU work (the common shift's rows)


@dataclass(frozen=True, slots=True)
class Host:
    """The host's speed now against the baselines', and whether it is slower."""

    probe_ratio: float | None  # the probe's median now / while learned (None: no probe)
    common_ratio: float | None  # the median of the CPU rows' median ratios
    rows: int  # CPU rows in the common shift
    factor: float  # what the rows are divided by (1: nothing put on the host)
    widen_pct: float  # added to the gate's fail_over_pct
    slower: bool  # the host: the probe past host_pct, and the rows moved
    wait_ratio: float | None = None  # the threads' waits per second run, now / learned


@dataclass(frozen=True, slots=True)
class Judged:
    """One row's verdict; `row` in trace diff's terms, on the host-normalised samples."""

    key: str
    kind: str
    name: str
    row: Row
    ratio: float  # median now (normalised) / median in the baseline
    baseline_p99_ms: float
    current_p50_ms: float  # not normalised: what was measured
    current_p99_ms: float


def host_speed(
    recent: Mapping[str, Values],
    baselines: Mapping[str, Baseline],
    probe_now: Values,
    waits_now: Values,
    gate: Gate,
    host_pct: float,
) -> Host:
    """The factor of this comparison, and the host's verdict (see the top)."""
    ratios, probes, waits = [], [], []
    for key, now in recent.items():
        base = baselines.get(key)
        if base is None or now.size < MIN_SAMPLES:
            continue
        if base.probe.size and probe_now.size:
            probes.append(_median(probe_now) / max(_median(base.probe), 1.0))
        if base.contention.size and waits_now.size:
            waits.append(_median(waits_now) / max(_median(base.contention), 1.0))
        if base.kind in CPU_KINDS and _median(base.samples) >= gate.min_ms * 1000:
            ratios.append(_median(now) / max(_median(base.samples), 1.0))
    probe = statistics.median(probes) if probes else None
    wait = statistics.median(waits) if waits else None
    common = statistics.median(ratios) if ratios else None
    margin = host_pct / 200
    factor = max(probe or 1.0, wait or 1.0)
    factor = factor if factor > 1 + margin else 1.0
    moved = common is not None and common > 1 + margin
    slower = probe is not None and probe >= 1 + host_pct / 100 and moved
    return Host(probe, common, len(ratios), factor, (factor - 1) * 100, slower, wait)


def judge(
    recent: Mapping[str, Values],
    baselines: Mapping[str, Baseline],
    model_streams: Mapping[str, set[str]],
    host: Host,
    gate: Gate,
) -> list[Judged]:
    """Every row with a baseline and enough recent samples, judged."""
    before, after = Samples(), Samples()
    for key, now in recent.items():
        base = baselines.get(key)
        if base is None or now.size < MIN_SAMPLES:
            continue
        before.rows[(base.kind, base.name)] = base.samples.tolist()
        after.rows[(base.kind, base.name)] = np.rint(now / host.factor).astype(np.int64).tolist()
    for model, streams in model_streams.items():
        before.model_streams[model] = set(streams)
    widened = replace(gate, fail_over_pct=gate.fail_over_pct + host.widen_pct)
    out = []
    for key, now in recent.items():
        base = baselines.get(key)
        if base is None or (base.kind, base.name) not in after.rows:
            continue
        row = compare_row(base.kind, base.name, before, after, widened)
        ratio = row.after_ms / row.before_ms if row.before_ms > 0 else 1.0
        p99 = _percentile_ms(base.samples, 99)
        p50_now, p99_now = _percentile_ms(now, 50), _percentile_ms(now, 99)
        out.append(Judged(key, base.kind, base.name, row, ratio, p99, p50_now, p99_now))
    return out


def _median(values: Values) -> float:
    return float(np.median(values))


def _percentile_ms(values: Values, q: float) -> float:
    return round(float(np.percentile(values, q)) / 1000, 3)
