"""A shadow's budget: what it may cost the live streams, held by its own sampling rate.

The shadow shares the cores (and the models' batchers) with the live streams. On a
machine with room to spare it costs them nothing; on a saturated one, every frame it
runs is CPU the live workflows do not get. So the shadow measures the live streams'
processed frames per second itself, with and without its own work: for one period it
samples nothing (the baseline), then it samples and compares. Their mean frame age is
measured the same way: the shadow's cost at a period is the larger of the live rate's
fall and the mean age's growth, each as a share of its baseline. When that cost is
more than `max_live_cost` it halves its sampling rate (twice the `every`) at once;
after three periods in a row under half the budget it doubles it again, never above
the rate asked for (quick to back off, slow to come back: the shape of TCP's congestion
control, in powers of two).
The baseline is measured again every `rebase_periods`, so a machine that changed speed
meanwhile is not taken for the shadow's cost.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

log = logging.getLogger("appliance.shadow")

PERIOD_S = 2.0  # one measurement: about 30 frames of a 15 fps camera
REBASE_PERIODS = 15  # a new baseline every 30 s
MAX_EVERY = 256  # the sparsest sampling it backs off to
CALM_PERIODS = 3  # quiet periods in a row before it samples more again (6 s)


class Budget:
    """Driven by the shadow's thread (`step`); read by the live worker (`paused`, `every`)."""

    def __init__(
        self,
        live_frames: Callable[[], int],
        max_cost: float,
        every: int,
        period_s: float = PERIOD_S,
        rebase_periods: int = REBASE_PERIODS,
        start: float | None = None,
        live_ages: Callable[[], float] = lambda: 0.0,
    ) -> None:
        self._live_frames = live_frames  # frames every live stream processed so far
        # The frame ages of those frames, summed (s): a period's mean frame age, with and
        # without the shadow (the budget acts on the rate; the age is reported).
        self._live_ages = live_ages
        self.max_cost = max_cost
        self.requested = every
        self.every = every  # what the shadow samples now
        self.paused = True  # measuring the baseline: nothing sampled
        self.baseline_fps: float | None = None
        self.live_fps: float | None = None
        # At the last period: the larger of 1 - live fps / baseline and the growth of the
        # live mean frame age over its baseline's.
        self.cost: float | None = None
        self.throttled = False
        self.baseline_age_ms: float | None = None  # mean live frame age without the shadow
        self.live_age_ms: float | None = None  # ... with it, at the last period
        self._period_s = period_s
        self._rebase = rebase_periods
        self._periods = 0
        self._calm = 0  # periods in a row under half the budget
        self._mark = (time.monotonic() if start is None else start, live_frames(), live_ages())

    def step(self, now: float | None = None) -> None:
        """Close a period once it has lasted `period_s` (call often: it is cheap)."""
        now = time.monotonic() if now is None else now
        start, frames, ages = self._mark
        if now - start < self._period_s:
            return
        count, age = self._live_frames(), self._live_ages()
        fps = (count - frames) / (now - start)
        mean_age_ms = (age - ages) / (count - frames) * 1e3 if count > frames else None
        self._mark = (now, count, age)
        if self.paused:
            self.baseline_fps, self.baseline_age_ms, self.paused = fps, mean_age_ms, False
            return
        self.live_fps, self.live_age_ms, self._periods = fps, mean_age_ms, self._periods + 1
        if self.baseline_fps:
            self.cost = max(0.0, 1.0 - fps / self.baseline_fps, self._age_cost())
            self._adjust(self.cost)
        if self._periods % self._rebase == 0:
            self.paused = True  # the next period measures the baseline again

    def _age_cost(self) -> float:
        """How much older the live frames are than without the shadow, as a share."""
        base, now = self.baseline_age_ms, self.live_age_ms
        return 0.0 if not base or now is None else now / base - 1.0

    def _adjust(self, cost: float) -> None:
        before = self.every
        if cost > self.max_cost:
            self.every, self._calm = min(self.every * 2, MAX_EVERY), 0
        elif cost < self.max_cost / 2:
            # Back up only after CALM_PERIODS in a row under half the budget: one quiet
            # period is as often the machine's noise as room to spare, and backing up
            # too soon makes the rate swing about the budget instead of staying under it.
            self._calm += 1
            if self._calm >= CALM_PERIODS and self.every > self.requested:
                self.every, self._calm = max(self.requested, self.every // 2), 0
        else:
            self._calm = 0
        throttled = self.every > self.requested
        if self.every != before:
            log.info("shadow sampling: every %d frames (live cost %.1f %%, budget %.1f %%)",
                     self.every, cost * 100, self.max_cost * 100)  # fmt: skip
        self.throttled = throttled

    def report(self) -> dict[str, Any]:
        return {
            "max_live_cost": self.max_cost,
            "every": self.every,
            "throttled": self.throttled,
            "measuring_baseline": self.paused,
            "baseline_fps": _round(self.baseline_fps),
            "live_fps": _round(self.live_fps),
            "live_cost": _round(self.cost),
            "baseline_age_ms": _round(self.baseline_age_ms),
            "live_age_ms": _round(self.live_age_ms),
        }


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 3)
