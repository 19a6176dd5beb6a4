"""The regression watch: every stream's blocks, frame age, and every model's `session.run`
and queue wait, judged against their baselines every `interval_s` on one thread (`watch`),
with `trace diff`'s rule after the host's own slowdown is taken out (judge.py).

A row with no baseline learns one: `learn_s` of samples after the stream's warm-up, kept in
the store beside the traces, its own cost per run beside its latency. A row slower for
`confirm_intervals` comparisons in a row, by its own cost where it has one, is a regression
(rows.py says what is raised); one slower only by waiting is contention (contention.py);
it ends after `recover_intervals` that are not.
A row whose interval brought too few samples to judge (a stream at a few fps) is held
and judged with the next interval's.
On a new regression the watch opens a profiling window itself (evidence.py).

Cost: the recorders add a row of integer stores per frame and batch; the thread runs the
probe `TICKS` times an interval and one comparison (a rank test per row) each interval.
Memory is bounded per row: a ring, a baseline of `reservoir` samples, and while learning at
most `LEARN_CAP` × `reservoir`.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from appliance.watch.baseline import Baseline, BaselineStore, Learning, row_key, subsample
from appliance.watch.config import WatchConfig
from appliance.watch.evidence import EvidenceWindows
from appliance.watch.judge import host_speed, judge
from appliance.watch.probe import Probe
from appliance.watch.ranktest import MIN_SAMPLES
from appliance.watch.recorder import AGE, FRAME, ModelRecorder, Samples, StreamRecorder
from appliance.watch.report import Regression, StreamWatch, WatchReport
from appliance.watch.rows import Rows
from appliance.watch.rule import Gate
from pipelines.types import FrameResult

log = logging.getLogger("appliance.watch")

TICKS = 10  # probe runs per interval (the last one is followed by the comparison)
LEARN_CAP = 20  # × reservoir: the most samples a row gathers while learning


@dataclass(frozen=True, slots=True)
class WatchHooks:
    """What the watch needs from the runtime, injected (it imports no runtime)."""

    # An event to the outputs of these streams (None: every sink, appliance-wide).
    publish: Callable[[list[str] | None, dict[str, Any]], None]
    # Open a profiling window (duration_s, streams or None, ort_operators): its id.
    open_window: Callable[[float, list[str] | None, bool], str]
    window_active: Callable[[], bool]


@dataclass(frozen=True, slots=True)
class Recent:
    """A row's samples of one interval: latency, and own cost per run (may be empty)."""

    kind: str
    name: str
    values: Samples
    cpu: Samples


@dataclass(slots=True)
class _Stream:
    recorder: StreamRecorder
    models: frozenset[str]
    block_models: Mapping[str, str]
    # Rows of blocks run only while someone watches (drawing): none to wait for unrun.
    on_demand: frozenset[str] = frozenset()


class Watch:
    """`attach` each stream as it starts; `start` once, `stop` once."""

    def __init__(
        self,
        config: WatchConfig,
        store: BaselineStore,
        hooks: WatchHooks,
        rows: Rows,
        probe: Probe | None = None,
    ) -> None:
        self.config = config
        self.store = store
        self.hooks = hooks
        c = config
        self.gate = Gate(c.fail_over_pct, c.min_ms, c.min_frame_pct, c.confidence)
        self.ring_size = max(config.window_samples, 256)
        self.models = ModelRecorder(self.ring_size, config.warmup_s)  # the pool's on_batch
        self.probe = probe or Probe()
        self.rows = rows
        self._streams: dict[str, _Stream] = {}
        self._learning: dict[str, tuple[str, str, Learning]] = {}  # key -> kind, name, data
        # The profiling windows it opens on what it raises (evidence.py).
        self.evidence = EvidenceWindows(config, hooks.open_window, self.model_streams)
        # Rows whose interval brought fewer than MIN_SAMPLES (a stream at a few fps, a
        # rarely gated block): held for the next comparison, which judges them together.
        self._held: dict[str, tuple[Samples, Samples]] = {}  # latency, own cost
        self._last = time.perf_counter()
        self._probe_cpu_s = 0.0  # the probe's CPU counted into the metric so far
        self._lock = threading.RLock()  # the watch's state, for the API's readers
        # Told each comparison's new regressions, on the watch's thread after its lock is
        # let go (a listener may switch a stream's workflow: attach takes the lock).
        self._listeners: list[Callable[[list[Regression]], None]] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # -- wiring ------------------------------------------------------------------------
    def attach(
        self,
        stream_id: str,
        block_ids: tuple[str, ...],
        block_models: Mapping[str, str],
        on_demand: Iterable[str] = (),
    ) -> StreamRecorder:
        """A stream (re)starts with these blocks: its recorder (an outputs subscriber for
        that stream), warming up for `warmup_s`. `on_demand`: the blocks that run only
        while someone watches (CompiledWorkflow.video_only)."""
        recorder = StreamRecorder(stream_id, block_ids, self.ring_size)
        recorder.skip(self.config.warmup_s)
        with self._lock:
            models = frozenset(block_models.values())
            lazy = frozenset(row_key("block", f"{stream_id}/{b}") for b in on_demand)
            stream = self._streams[stream_id] = _Stream(recorder, models, dict(block_models), lazy)
            # A baseline half learned before a (re)start would mix two workflows' samples.
            for key in self._keys_of(stream_id, stream, models=False):
                self._learning.pop(key, None)
                self._held.pop(key, None)
        return recorder

    def on_raised(self, listener: Callable[[list[Regression]], None]) -> None:
        """Call `listener` with the regressions each comparison raises (not the host's
        slowdowns), after they are announced."""
        self._listeners.append(listener)

    def detach(self, stream_id: str) -> None:
        with self._lock:
            self._streams.pop(stream_id, None)

    def __call__(self, result: FrameResult) -> None:
        """The outputs' subscriber, on the stream's worker: a dict lookup per frame."""
        stream = self._streams.get(result.stream_id)
        if stream is not None:
            stream.recorder(result)

    def block_model(self, name: str) -> str | None:
        """The model a `<stream>/<block>` row runs, if any."""
        stream_id, _, block = name.partition("/")
        stream = self._streams.get(stream_id)
        return None if stream is None else stream.block_models.get(block)

    def model_streams(self) -> dict[str, set[str]]:
        """Each model's streams (the streams whose workflow runs it)."""
        out: dict[str, set[str]] = {}
        for stream_id, stream in list(self._streams.items()):
            for model_id in stream.models:
                out.setdefault(model_id, set()).add(stream_id)
        return out

    def changed(self, what: str, summary: str) -> None:
        """Something an operator did that may change latency (a reload, a restart): named
        by every regression found after it. Models warm up again after a reload."""
        self.rows.changed(what, summary)
        if what == "reload":  # a model may have loaded anew: warm-up, and learn afresh
            with self._lock:
                for model_id in list(self.models.runs):
                    self.models.skip(model_id, self.config.warmup_s)
                    # Runs the rings still hold are the model before the reload: judged
                    # with the new one's, they made a mixed row (x2.2 for a x10 change).
                    self.models.runs[model_id].take()
                    self.models.waits[model_id].take()
                    for key in (row_key("model", model_id), row_key("queue", model_id)):
                        self._learning.pop(key, None)
                        self._held.pop(key, None)

    @contextmanager
    def still(self) -> Iterator[None]:
        """Around an operator's change (a reload): nothing is recorded while it loads
        models and compiles (CPU the streams do not get), nor for warmup_s after."""
        self._pause(math.inf)
        try:
            yield
        finally:
            self._pause(self.config.warmup_s, reset=True)

    def rebaseline(self, stream_id: str) -> list[str]:
        """Forget the stream's baselines (its blocks, frame, frame age and the models it
        runs) and learn them again from now; the rows' regressions end. The row keys."""
        with self._lock:
            stream = self._streams[stream_id]  # KeyError: not attached (the caller checks)
            keys = self._keys_of(stream_id, stream)
            self.store.drop(keys)
            for key in keys:
                self._learning.pop(key, None)
                self._held.pop(key, None)
            self.rows.forget(keys, "re-baselined")
        return keys

    # -- reading ---------------------------------------------------------------------
    def stream_status(self, stream_id: str) -> StreamWatch:
        with self._lock:
            stream = self._streams.get(stream_id)
            if stream is None or not self.config.enabled:
                return StreamWatch("off", [])
            keys = self._keys_of(stream_id, stream, models=False)
            warming = stream.recorder.skip_until > time.perf_counter()
            progress = self._progress(keys)
            idle = frozenset(k for k in stream.on_demand if k in progress and not self._gathered(k))
            learning = {k: p for k, p in progress.items() if k not in idle}
            return self.rows.stream_status(stream_id, keys, warming, learning, idle)

    def report(self) -> WatchReport:
        with self._lock:
            return self.rows.report(self.config.enabled, self.config.interval_s, self.store)

    # -- the thread ------------------------------------------------------------------
    def start(self) -> None:
        if not self.config.enabled:
            return
        self.probe.open()  # its model's one-time build, off the watch's ticks
        self._last = time.perf_counter()
        self._thread = threading.Thread(target=self._run, name="watch", daemon=True)
        self._thread.start()

    def stop(self, timeout: float) -> bool:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
            return not self._thread.is_alive()
        return True

    def _run(self) -> None:
        tick = self.config.interval_s / TICKS
        count = 0
        while not self._stop.wait(tick):
            try:
                if self.hooks.window_active():  # the profiler's cost is not the workflow's
                    self._pause(tick + 0.5)
                self.probe.run()
                self._count_probe_cost()
                count += 1
                if count % TICKS == 0:
                    self.compare()
            except Exception:  # the watch must never take the appliance down
                log.exception("regression watch: a comparison failed; the next one goes on")

    def _count_probe_cost(self) -> None:
        cpu_s = self.probe.cost().cpu_s
        self.rows.metrics.watch_probe_cpu.inc(max(0.0, cpu_s - self._probe_cpu_s))
        self._probe_cpu_s = cpu_s

    # -- one comparison --------------------------------------------------------------
    def compare(self) -> None:
        """Collect the interval's samples, learn the rows without a baseline, judge the
        others and raise or end regressions."""
        now = time.perf_counter()
        since, self._last = self._last, now
        with self._lock:
            recent = self._collect()
            self._learn(recent, now)
            baselines = {k: b for k in recent if (b := self.store.get(k)) is not None}
            values = {k: r.values for k, r in recent.items()}
            cpu = {k: r.cpu for k, r in recent.items() if r.cpu.size}
            probe_now, waits_now, probe_cpu_now = self.probe.since(since)
            # A baseline whose probe timed another measure tells nothing of the host's speed.
            measure = self.probe.cost().measure
            comparable = {
                k: b
                if b.probe_measure == measure
                else replace(b, probe=b.probe[:0], probe_cpu=b.probe_cpu[:0])
                for k, b in baselines.items()
            }
            host = host_speed(
                values, comparable, (probe_now, probe_cpu_now), waits_now, self.gate,
                self.config.host_pct,
            )  # fmt: skip
            judged = judge(values, baselines, self.model_streams(), host, self.gate, cpu)
            if log.isEnabledFor(logging.DEBUG):
                log.debug(
                    "host %s; %s",
                    host,
                    [(j.key, j.row.verdict, round(j.ratio, 2), j.row.count_after) for j in judged],
                )
            attached = set(self._streams)
            raised = self.rows.apply(judged, host, baselines, attached)
            self._follow_load(baselines)
            evidence, opened = self.evidence.open(raised) if raised else (None, False)
            if opened:  # nothing recorded while it runs: the profiler's cost is not theirs
                self._pause(self.config.evidence_s + 1.0)
            for regression in raised:
                regression.evidence = evidence
                self.rows.announce(regression)
        rows = [r for r in raised if r.kind != "host"]
        for listener in self._listeners if rows else ():
            try:
                listener(rows)
            except Exception:  # a listener's failure must not stop the comparisons
                log.exception("regression watch: a listener failed")

    def _follow_load(self, baselines: Mapping[str, Baseline]) -> None:
        """Victims of a change of load that has settled learn their baselines again: the
        new load is the normal now (their own cost did not change: contention.py)."""
        stale = self.rows.settled_victims(baselines)
        if stale:
            self.store.drop(stale)
            self.rows.forget(stale, "re-learned after a change of load")
            log.info("regression watch: learning again after a change of load: %s", stale)

    def _collect(self) -> dict[str, Recent]:
        """Every row's samples since the last comparison, at most window_samples each,
        with its own cost per run where it has one."""
        out: dict[str, Recent] = {}
        empty = np.empty(0, np.int64)

        def add(kind: str, name: str, values: Samples, cpu: Samples = empty) -> None:
            key = row_key(kind, name)
            held = self._held.pop(key, None)
            if held is not None:
                values = np.concatenate((held[0], values))[-self.ring_size :]
                cpu = np.concatenate((held[1], cpu))[-self.ring_size :]
            if values.size >= MIN_SAMPLES:
                out[key] = Recent(kind, name, self._window(values), self._window(cpu))
            elif values.size:  # too few to judge (a slow stream): the next interval adds
                self._held[key] = (values, cpu)

        for stream_id, stream in self._streams.items():
            cols = stream.recorder.ring.take()
            add("frame", stream_id, cols[FRAME])
            add("frame age", stream_id, cols[AGE])
            blocks = stream.recorder.block_ids
            for i, block_id in enumerate(blocks):
                add("block", f"{stream_id}/{block_id}", cols[2 + i], cols[2 + len(blocks) + i])
        for model_id, runs in list(self.models.runs.items()):
            run, cpu = runs.take()
            add("model", model_id, run, cpu)
            add("queue", model_id, self.models.waits[model_id].take()[0])
        return out

    def _window(self, values: Samples) -> Samples:
        return subsample(values, self.config.window_samples, seed=self.rows.comparisons)

    def _learn(self, recent: Mapping[str, Recent], now: float) -> None:
        """Rows without a baseline gather samples; after learn_s they have one."""
        done: list[Baseline] = []
        cap = LEARN_CAP * self.config.reservoir
        for key, r in recent.items():
            if self.store.get(key) is not None:
                continue
            _, _, learning = self._learning.setdefault(key, (r.kind, r.name, Learning(now)))
            learning.add(r.values, cap, r.cpu)
            gathered = learning.samples()
            if now - learning.started >= self.config.learn_s and gathered.size >= MIN_SAMPLES:
                done.append(self._learned(r.kind, r.name, learning, seed=len(done)))
                del self._learning[key]
        if done:
            self.store.put(done)
            names = ", ".join(row_key(b.kind, b.name) for b in done)
            log.info("regression watch: learned %s", names)

    def _learned(self, kind: str, name: str, learning: Learning, seed: int) -> Baseline:
        probe, waits, probe_cpu = self.probe.since(learning.started)
        reservoir = self.config.reservoir
        sample = subsample(learning.samples(), reservoir, seed=seed)
        cpu = learning.cpu.kept
        cpu = subsample(cpu, reservoir, seed=seed) if cpu.size >= MIN_SAMPLES else cpu[:0]
        spread, cpu_spread = learning.spreads()
        measure = self.probe.cost().measure
        model = self.block_model(name) if kind == "block" else None
        return Baseline(
            kind, name, sample, probe, time.time(), "learned", waits, cpu, spread, cpu_spread,
            measure, probe_cpu, model,
        )  # fmt: skip

    def _progress(self, keys: list[str]) -> dict[str, float]:
        """Each key without a baseline: how far its learning is (0 before it began)."""
        now = time.perf_counter()
        out = {}
        for key in keys:
            if self.store.get(key) is not None:
                continue
            entry = self._learning.get(key)
            out[key] = (
                0.0 if entry is None else min(1.0, (now - entry[2].started) / self.config.learn_s)
            )
        return out

    def _gathered(self, key: str) -> bool:  # the row, without a baseline, has samples
        entry = self._learning.get(key)
        return entry is not None and entry[2].count > 0

    def _keys_of(self, stream_id: str, stream: _Stream, models: bool = True) -> list[str]:
        keys = [row_key("frame", stream_id), row_key("frame age", stream_id)]
        keys += [row_key("block", f"{stream_id}/{b}") for b in stream.recorder.block_ids]
        if models:
            for model_id in sorted(stream.models):
                keys += [row_key("model", model_id), row_key("queue", model_id)]
        return keys

    def _pause(self, seconds: float, *, reset: bool = False) -> None:
        """Record nothing for `seconds` from now: longer pauses stay, unless `reset`."""
        until = time.perf_counter() + seconds
        for stream in list(self._streams.values()):
            recorder = stream.recorder
            recorder.skip_until = until if reset else max(until, recorder.skip_until)
        models = self.models
        models.paused_until = until if reset else max(until, models.paused_until)
