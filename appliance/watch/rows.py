"""The regression watch's verdicts over time: which rows (and the host) are in regression,
since when, the history, the changes that may explain them, and what goes out (metrics,
events).

What is raised:
- a block or a model's `session.run` slower for `confirm_intervals` comparisons in a row;
- a frame age for one interval more, and only while the host is not slower and nothing
  of its stream is raised already: it follows from a slower block or model, and a person
  wants the cause, not its echo;
- the host, when its factor is past `host_pct` (judge.py) for as long.
A whole frame (`frame:` rows) is only a weight, never raised. Muted rows are judged and
shown, never raised. Each ends after `recover_intervals` comparisons that are not slower.
A row slower only because it waited (contention.py: its own cost did not grow) is not
slower here: it is a victim, reported as contention or as a change of load. A queue wait
is nothing but waiting (for its model's runs, and the other samples of their batches): it
is never raised, its model is (contention.py).
"""

from __future__ import annotations

import fnmatch
import logging
import time
import uuid
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from appliance.observe.metrics import Metrics
from appliance.observe.status import as_json
from appliance.watch.baseline import Baseline, BaselineStore, kind_of, stream_of_row
from appliance.watch.contention import Contention
from appliance.watch.judge import Host, Judged
from appliance.watch.report import (
    Change,
    ContentionEvent,
    Regression,
    RowWatch,
    StreamWatch,
    WatchReport,
    WatchState,
)
from appliance.watch.rule import SLOWER
from pipelines.types import iso_utc

log = logging.getLogger("appliance.watch")
HISTORY = 200  # ended regressions kept for the API
CHANGES = 32  # changes kept to name a regression's cause
RAISED = ("block", "model")
ECHOES = ("frame age",)


@dataclass(slots=True)
class _State:
    slower: int = 0  # comparisons in a row that were slower
    fine: int = 0  # ... that were not
    active: Regression | None = None
    last: Judged | None = None


@dataclass
class Rows:
    """Updated by the watch thread under the watch's lock; read by the API under it."""

    confirm: int
    recover: int
    mute: Sequence[str]
    metrics: Metrics
    publish: Callable[[list[str] | None, dict[str, Any]], None]
    block_models: Callable[[str], str | None]  # "<stream>/<block>" -> its model, if any
    model_streams: Callable[[str], list[str]]
    settle_s: float = 60.0  # after a change of load, its victims are its (contention.py)
    comparisons: int = 0
    host_factor: float | None = None
    contention: Contention = field(default_factory=Contention)
    _states: dict[str, _State] = field(default_factory=dict)
    _host: _State = field(default_factory=_State)
    _history: deque[Regression] = field(default_factory=lambda: deque(maxlen=HISTORY))
    _changes: deque[tuple[float, Change]] = field(default_factory=lambda: deque(maxlen=CHANGES))

    def changed(self, what: str, summary: str) -> None:
        now = time.time()
        self._changes.append((now, Change(what, iso_utc(now), summary)))

    # -- one comparison's verdicts -----------------------------------------------------
    def apply(
        self,
        judged: Sequence[Judged],
        host: Host,
        baselines: Mapping[str, Baseline],
        attached: set[str],
    ) -> list[Regression]:
        """Count the verdicts; the regressions raised now (announce each after)."""
        self.comparisons += len(judged)
        self.metrics.watch_comparisons.inc(len(judged))
        if not judged:  # nothing recorded (paused, warming up): no verdict either way
            return []
        self.host_factor = host.factor
        raised = self._apply_host(host)
        settling = self._settling()
        victims = self.contention.judge(
            judged,
            settling is not None,
            self.block_models,
            self._after_change(baselines),
            self._swapped(judged, baselines),
        )
        for j in judged:
            self._count(j, j.key in victims)
        busy = {
            self._scope(k) for k, s in self._states.items() if s.active and s.active.kind in RAISED
        }
        for j in sorted(judged, key=lambda j: j.kind not in RAISED):  # causes before echoes
            state = self._states[j.key]
            if state.active is None and self._due(j, state, host, busy):
                state.active = self._regression(j, host, baselines[j.key])
                busy.add(self._scope(j.key))
                raised.append(state.active)
            elif state.active is not None and state.fine >= self.recover:
                self._end(j.key, state, "recovered")
            self._export(j, state)
        for key, state in self._states.items():
            stream = state.active.stream if state.active else None
            if stream is not None and stream not in attached:
                self._end(key, state, "stream removed")
        culprits = sorted(r.name for r in self.active() if r.kind in RAISED)
        event = self.contention.event(victims, judged, culprits, settling, host)
        if event is not None:
            self._announce_contention(event)
        return raised

    def _swapped(
        self, judged: Sequence[Judged], baselines: Mapping[str, Baseline]
    ) -> frozenset[str]:
        """Blocks that run another model than the one their baseline was learned with."""
        return frozenset(
            j.key
            for j in judged
            if j.kind == "block"
            and (learned := baselines[j.key].model) is not None
            and learned != self.block_models(j.name)
        )

    def _settling(self) -> Change | None:
        """The latest change of load younger than settle_s: it explains what waits now."""
        now = time.time()
        recent = [c for t, c in self._changes if now - t < self.settle_s]
        return recent[-1] if recent else None

    def _after_change(self, baselines: Mapping[str, Baseline]) -> Callable[[str], bool]:
        """Whether a change of load was recorded after a row's baseline was learned."""
        latest = max((t for t, _ in self._changes), default=None)

        def after(key: str) -> bool:
            base = baselines.get(key)
            return latest is not None and base is not None and latest > base.learned_at

        return after

    def settled_victims(self, baselines: Mapping[str, Baseline]) -> list[str]:
        """Victims whose baseline is older than a change of load that has settled since:
        their baselines follow the new load (the watch learns them again)."""
        now = time.time()
        out = []
        for key in sorted(self.contention.victims):
            base = baselines.get(key)
            changes = [t for t, _ in self._changes if base is not None and t > base.learned_at]
            if changes and now - max(changes) >= self.settle_s:
                out.append(key)
        return out

    def _announce_contention(self, event: ContentionEvent) -> None:
        names = ", ".join(f"{v.name} x{v.ratio:.2f}" for v in event.rows)
        cause = (
            f"{event.change.what}: {event.change.summary}"
            if event.change
            else ", ".join(event.culprits) or f"waits for a core x{event.wait_ratio or 1:.2f}"
        )
        log.info("%s: %s (own cost unchanged; %s)", event.type, names, cause)
        self.metrics.watch_contention.labels(event.type).inc()
        streams = sorted({s for v in event.rows if (s := _stream_of_key(v.name))})
        self.publish(streams or None, {"type": event.type, event.type: as_json(event)})

    def _count(self, j: Judged, contended: bool) -> None:
        state = self._states.setdefault(j.key, _State())
        state.last = j
        if j.row.verdict == SLOWER and not contended:  # its own doing, or its model's
            state.slower, state.fine = state.slower + 1, 0
        else:
            state.slower, state.fine = 0, state.fine + 1

    def _due(self, j: Judged, state: _State, host: Host, busy: set[str]) -> bool:
        if j.kind not in RAISED + ECHOES or self._muted(j.key):
            return False
        if j.kind in RAISED:
            return state.slower >= self.confirm
        # An echo alone: one more interval, since a frame age also moves with the camera's
        # pace, more than a block's run does.
        alone = not host.slower and self._scope(j.key) not in busy
        return alone and state.slower >= self.confirm + 1

    def _muted(self, key: str) -> bool:
        return any(fnmatch.fnmatchcase(key, pattern) for pattern in self.mute)

    def _scope(self, key: str) -> str:
        """What a regression's echo would share with it: the stream, or the model."""
        if key.startswith("model:"):
            return "model " + key.partition(":")[2]
        if key.startswith("age:"):
            return "stream " + key.partition(":")[2]
        return "stream " + key.partition("/")[0]

    def _apply_host(self, host: Host) -> list[Regression]:
        state = self._host
        if host.slower:
            state.slower, state.fine = state.slower + 1, 0
        else:
            state.slower, state.fine = 0, state.fine + 1
        self.metrics.host_slowdown_ratio.set(host.factor)
        raised = []
        if state.active is None and state.slower >= self.confirm:
            state.active = _host_regression(host, self._change_since(0.0))
            raised.append(state.active)
        elif state.active is not None and state.fine >= self.recover:
            self._end("host", state, "recovered")
        self.metrics.host_slowdown.set(1 if state.active else 0)
        return raised

    def _regression(self, j: Judged, host: Host, base: Baseline) -> Regression:
        stream = stream_of_row(j.kind, j.name)
        block = j.name.partition("/")[2] if j.kind == "block" else None
        model = self.block_models(j.name) if j.kind == "block" else None
        if j.kind == "model":
            model = j.name
        r = j.row
        regression = Regression(
            uuid.uuid4().hex[:12],
            j.kind,
            j.key,
            stream,
            block,
            model,
            iso_utc(time.time()),
            r.before_ms,
            j.baseline_p99_ms,
            j.current_p50_ms,
            j.current_p99_ms,
            round(j.ratio, 3),
            r.effect_ms,
            r.low_ms,
            r.high_ms,
            r.p_value,
            round(host.factor, 3),
            host.probe_ratio,
            host.common_ratio,
            host.wait_ratio,
            self._change_since(base.learned_at),
            own_ratio=j.own_ratio,
        )
        return regression

    def _change_since(self, learned_at: float) -> Change | None:
        """The latest change after the baseline was learned: what may have caused it."""
        after = [c for t, c in self._changes if t >= learned_at]
        return after[-1] if after else None

    def _export(self, j: Judged, state: _State) -> None:
        on = 1 if state.active else 0
        if j.kind == "block":
            stream, _, block = j.name.partition("/")
            self.metrics.block_regression.labels(stream, block).set(on)
            self.metrics.block_regression_ratio.labels(stream, block).set(j.ratio)
        elif j.kind == "model":
            self.metrics.model_regression.labels(j.name).set(on)
            self.metrics.model_regression_ratio.labels(j.name).set(j.ratio)

    # -- going out ---------------------------------------------------------------------
    def announce(self, regression: Regression) -> None:
        """Log, count and publish a regression just raised."""
        self.metrics.regressions.labels(regression.kind).inc()
        kind = "host_slowdown_started" if regression.kind == "host" else "regression_started"
        name, ratio = regression.name, regression.ratio
        log.warning("%s: %s x%.2f (%s)", kind, name, ratio, _shift(regression))
        self.publish(self._audience(regression), {"type": kind, "regression": as_json(regression)})

    def _end(self, key: str, state: _State, reason: str) -> None:
        regression = state.active
        if regression is None:
            return
        state.active = None
        regression.active, regression.ended_at = False, iso_utc(time.time())
        regression.end_reason = reason
        self._history.appendleft(regression)
        kind = "host_slowdown_ended" if regression.kind == "host" else "regression_ended"
        log.info("%s: %s (%s)", kind, regression.name, reason)
        self.publish(self._audience(regression), {"type": kind, "regression": as_json(regression)})
        if regression.kind == "block" and regression.stream and regression.block:
            self.metrics.block_regression.labels(regression.stream, regression.block).set(0)
        elif regression.kind == "model" and regression.model:
            self.metrics.model_regression.labels(regression.model).set(0)

    def _audience(self, regression: Regression) -> list[str] | None:
        if regression.stream is not None:
            return [regression.stream]
        if regression.model is not None:
            return self.model_streams(regression.model) or None
        return None

    def forget(self, keys: Iterable[str], reason: str) -> None:
        """These rows start over (re-baselined): their regressions end."""
        for key in keys:
            state = self._states.pop(key, None)
            if state is not None:
                self._end(key, state, reason)

    # -- reading -----------------------------------------------------------------------
    def active(self) -> list[Regression]:
        return [s.active for s in self._states.values() if s.active is not None]

    def stream_status(
        self,
        stream_id: str,
        keys: list[str],
        warming: bool,
        learning: Mapping[str, float],
        idle: frozenset[str] = frozenset(),
    ) -> StreamWatch:
        """`idle`: rows of blocks that have not run (nobody watched their drawing)."""
        rows = [
            RowWatch(key, kind_of(key), "idle")
            if key in idle
            else self._row(key, learning.get(key))
            for key in keys
        ]
        mine = [r for r in self.active() if r.stream == stream_id]
        state: WatchState = "warming" if warming else "learning" if learning else "watching"
        return StreamWatch(state, [replace(r) for r in mine], rows)

    def _row(self, key: str, progress: float | None) -> RowWatch:
        state = self._states.get(key)
        last = state.last if state else None
        kind = last.kind if last else kind_of(key)
        if progress is not None:
            return RowWatch(key, kind, "learning", learn_progress=round(progress, 3))
        verdict = last.row.verdict if last else None
        if last is not None and key in self.contention.victims:
            verdict = "contention"  # slower, but only by waiting (contention.py)
        return RowWatch(
            key,
            kind,
            "watching" if last else "warming",
            verdict,
            round(last.ratio, 3) if last else None,
            own_ratio=last.own_ratio if last else None,
        )

    def report(self, enabled: bool, interval_s: float, store: BaselineStore) -> WatchReport:
        host = self._host.active
        return WatchReport(
            enabled,
            interval_s,
            self.comparisons,
            replace(host) if host else None,
            self.host_factor,
            [replace(r) for r in self.active()],
            [replace(r) for r in self._history],
            store.last_error,
            list(self.contention.events),
        )


def _host_regression(host: Host, change: Change | None) -> Regression:
    ratio = round(host.factor, 3)
    return Regression(
        uuid.uuid4().hex[:12],
        "host",
        "host",
        None,
        None,
        None,
        iso_utc(time.time()),
        0.0,
        0.0,
        0.0,
        0.0,
        ratio,
        host_ratio=ratio,
        probe_ratio=host.probe_ratio,
        common_ratio=host.common_ratio,
        wait_ratio=host.wait_ratio,
        change=change,
    )


def _shift(r: Regression) -> str:
    if r.shift_ms is None:
        return f"probe x{r.probe_ratio}, rows x{r.common_ratio}"
    return (
        f"median {r.baseline_p50_ms:.3f} -> {r.current_p50_ms:.3f} ms, "
        f"{r.shift_ms:+.3f} ms [{r.shift_low_ms:+.3f}, {r.shift_high_ms:+.3f}], p {r.p_value:.2g}"
    )


def _stream_of_key(key: str) -> str | None:
    """The stream a row key belongs to (None for a model's rows)."""
    kind = kind_of(key)
    name = key if kind == "block" else key.partition(":")[2]
    return stream_of_row(kind, name)
