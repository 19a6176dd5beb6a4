"""A running runtime as the thing tuned, and `tune()`: the whole run around the search,
which always leaves the runtime on the settings it started with, or on the winner when
asked to apply it (never on a half-measured candidate), whatever ends the run.

Candidates are applied through `Runtime.retune` (appliance/runtime/retuning.py): batching at
once, session options on a session opened beside the running one and swapped in, so no
stream restarts; only a source knob restarts the streams, and the window waits until
each one has results again. The regression watch holds still meanwhile (the latencies
it would see are the candidates'), and after an applied change it learns afresh. An
applied winner is kept in `server.state_dir` (appliance/runtime/tuningstate.py): a
restart runs it again, until the config file's `tuning:` changes.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from appliance.config import TuningConfig
from appliance.sources.base import StreamState, source_kind
from appliance.tune.meter import Meter, Window
from appliance.tune.objective import Kind, Objective, default_slo_ms
from appliance.tune.search import Progress, Tuner, TuneResult
from appliance.tune.space import (
    Hardware,
    Knob,
    Settings,
    model_knobs,
    restrict,
    source_knobs,
    to_tuning,
)

if TYPE_CHECKING:
    from appliance.runtime.runtime import Runtime

log = logging.getLogger("appliance.tune")

RESTART_WAIT_S = 15.0  # a restarted stream's first result: RTSP session, decoder, warm-up
RESTART_POLL_S = 0.1  # how often that wait looks
LOST = (StreamState.STOPPED, StreamState.FAILED, StreamState.STALLED)


class LiveTarget:
    """The runtime's own streams, models and outputs, measured from their results."""

    def __init__(
        self,
        rt: Runtime,
        knobs: list[Knob],
        base: TuningConfig,
        stop: threading.Event | None = None,
    ) -> None:
        self.rt, self.knobs, self.base = rt, knobs, base
        self.stop = stop or threading.Event()  # ends a wait for restarted streams early
        self.streams = list(rt.streams)  # every one must still run at each window's end
        self.meter = Meter()
        self._unsubscribe = rt.outputs.subscribe(self.meter)

    def apply(self, settings: Settings) -> None:
        done = self.rt.retune(to_tuning(self.base, settings, self.knobs))
        if done.restarted:
            self._wait_for_results(done.restarted)

    def measure(self, seconds: float, stop: threading.Event) -> Window | None:
        start = Meter.now()
        if stop.wait(seconds):
            return None
        end = Meter.now()
        return self.meter.window(start, end, self.streams, sum(self.camera_fps().values()))

    def problem(self) -> str | None:
        for sid in self.streams:
            stream = self.rt.streams.get(sid)
            if stream is None:
                return f"stream {sid!r} is gone"
            if stream.state in LOST:
                return f"stream {sid!r} is {stream.state.value}: {stream.last_error or '?'}"
        return None

    def camera_fps(self) -> dict[str, float]:
        """Each stream's source rate now (frames delivered per second)."""
        rates = {}
        for sid in self.streams:
            stream = self.rt.streams.get(sid)
            rate = stream.source_fps() if stream is not None else None
            rates[sid] = rate or 0.0
        return rates

    def restore(self) -> None:
        self.rt.retune(self.base)

    def close(self) -> None:
        self._unsubscribe()

    def _wait_for_results(self, streams: list[str]) -> None:
        """Until each restarted stream has a result; at once on `stop` (the tuner sees it
        next and ends: a Ctrl+C must not wait out RESTART_WAIT_S)."""
        mark, deadline = Meter.now(), time.monotonic() + RESTART_WAIT_S
        while time.monotonic() < deadline:
            window = self.meter.window(mark, Meter.now(), streams, 0.0)
            if window.slowest_fps > 0 or self.stop.wait(RESTART_POLL_S):
                return
        raise RuntimeError(f"streams {streams} had no result {RESTART_WAIT_S:g} s after restart")


def search_space(
    rt: Runtime, hardware: Hardware, only: Mapping[str, tuple[Any, ...] | None] | None = None
) -> list[Knob]:
    """The knobs of the models the streams run and of their sources, bounded by
    `hardware`; `only` keeps some (space.restrict)."""
    used = {m for s in rt.streams.values() for m in s.workflow.models}
    knobs = [
        knob
        for model_id, (spec, fixed) in sorted(rt.pool.specs().items())
        if model_id in used
        for knob in model_knobs(model_id, spec, hardware, fixed)
    ]
    rtsp = any(source_kind(s.cfg.source.url) == "rtsp" for s in rt.streams.values())
    sources = rt.config.tuning.sources.model_dump(exclude_none=True)
    knobs += source_knobs(rtsp, sources, hardware)
    return restrict(knobs, only)


def tune(
    rt: Runtime,
    *,
    objective: Kind = "fps",
    slo_ms: float | None = None,
    budget_s: float = 600.0,
    window_s: float = 5.0,
    settle_s: float = 2.0,
    only: Mapping[str, tuple[Any, ...] | None] | None = None,
    apply: bool = False,
    stop: threading.Event | None = None,
    on_progress: Callable[[Progress], None] | None = None,
    hardware: Hardware | None = None,
    target_type: type[LiveTarget] = LiveTarget,
) -> TuneResult:
    """Tune the running runtime: search, then leave it on its starting settings, or on
    the winner with `apply` (only after a search that was not interrupted or failed).
    `target_type`: a LiveTarget whose windows' figures come from elsewhere may stand in
    (tests/tune/test_interrupt.py: their subject is what the applies leave, not a
    measured verdict a busy machine could turn into a tie)."""
    base = rt.config.tuning
    knobs = search_space(rt, hardware or Hardware.here(), only)
    stop = stop or threading.Event()
    target = target_type(rt, knobs, base, stop)
    slo = slo_ms or default_slo_ms(list(target.camera_fps().values()))
    tuner = Tuner(
        target,
        knobs,
        Objective(objective, slo),
        window_s,
        settle_s,
        budget_s,
        stop=stop,
        on_progress=on_progress,
    )
    result: TuneResult | None = None
    try:
        with rt.watch.still():  # the windows are the candidates', not the workload's
            result = tuner.run()
    finally:
        keep = apply and result is not None and result.outcome in ("done", "budget")
        _finish(rt, target, result if keep else None)
    return result


def _finish(rt: Runtime, target: LiveTarget, applied: TuneResult | None) -> None:
    """Back to the starting settings, or on to the winner; the target let go."""
    try:
        if applied is None or not applied.changed:
            target.restore()
            return
        try:
            target.apply(applied.best)
        except BaseException:
            target.restore()  # neither the start nor the winner must be left half-applied
            raise
        applied.problem = rt.keep_tuning() or applied.problem  # kept across restarts, or why not
        summary = ", ".join(f"{k}={v}" for k, v in applied.changed.items())
        rt.watch.changed("tune", f"appliance tune applied {summary}")
        for sid in list(rt.streams):  # the new settings are the new normal: learn them
            with contextlib.suppress(KeyError):  # not watched (a disabled watch)
                rt.watch.rebaseline(sid)
    finally:
        target.close()
