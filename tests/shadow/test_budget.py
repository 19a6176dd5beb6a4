"""The shadow's budget on a counted live rate: a baseline period without the shadow, then
its sampling halved while the live streams lose more than the budget, and given back
once they do not; a new baseline now and then."""

from __future__ import annotations

from appliance.runtime.budget import Budget


class Live:
    """The live streams' processed-frame count, advanced by hand at a given rate, and
    their frame ages summed."""

    def __init__(self) -> None:
        self.frames = 0
        self.ages = 0.0
        self.age_s = 0.05  # each frame's age

    def __call__(self) -> int:
        return self.frames


def run(budget: Budget, live: Live, fps: float, periods: int, t: list[float]) -> list[int]:
    """`periods` periods of 2 s at `fps`: the sampling (`every`) after each."""
    out = []
    for _ in range(periods):
        live.frames += round(fps * 2)
        live.ages += round(fps * 2) * live.age_s
        t[0] += 2.0
        budget.step(t[0])
        out.append(budget.every)
    return out


def test_it_backs_off_while_the_live_rate_suffers_and_comes_back() -> None:
    live, t = Live(), [100.0]
    budget = Budget(live, max_cost=0.05, every=1, period_s=2.0, rebase_periods=100, start=t[0])
    assert budget.paused  # the first period measures the live rate without the shadow
    assert run(budget, live, 30.0, 1, t) == [1]
    assert (budget.baseline_fps, budget.paused) == (30.0, False)
    # 10 % fewer live frames: over the 5 % budget, the sampling halves each period.
    assert run(budget, live, 27.0, 3, t) == [2, 4, 8]
    assert budget.throttled and budget.cost is not None and round(budget.cost, 3) == 0.1
    # Under half the budget three periods in a row: it doubles back, never past the rate
    # asked for.
    assert run(budget, live, 29.7, 10, t) == [8, 8, 4, 4, 4, 2, 2, 2, 1, 1]
    assert not budget.throttled


def test_a_period_not_quiet_enough_restarts_the_count() -> None:
    live, t = Live(), [0.0]
    budget = Budget(live, max_cost=0.05, every=1, period_s=2.0, rebase_periods=100, start=t[0])
    run(budget, live, 30.0, 1, t)  # the baseline
    assert run(budget, live, 27.0, 2, t) == [2, 4]
    assert run(budget, live, 29.7, 2, t) == [4, 4]
    assert run(budget, live, 29.0, 1, t) == [4]  # cost 3.3 %: within 5 %, not under 2.5 %
    assert run(budget, live, 29.7, 3, t) == [4, 4, 2]


def test_a_shadow_that_costs_nothing_keeps_its_rate() -> None:
    live, t = Live(), [0.0]
    budget = Budget(live, max_cost=0.05, every=2, period_s=2.0, rebase_periods=100, start=t[0])
    assert run(budget, live, 15.0, 6, t) == [2] * 6
    assert budget.report()["live_cost"] == 0.0 and not budget.throttled


def test_the_baseline_is_measured_again() -> None:
    live, t = Live(), [0.0]
    budget = Budget(live, max_cost=0.05, every=1, period_s=2.0, rebase_periods=3, start=t[0])
    run(budget, live, 30.0, 1, t)  # the baseline: 30
    run(budget, live, 30.0, 3, t)
    assert budget.paused  # three periods on: the next one measures without the shadow
    run(budget, live, 20.0, 1, t)  # the machine got slower meanwhile
    assert (budget.baseline_fps, budget.paused) == (20.0, False)
    assert run(budget, live, 20.0, 2, t) == [1, 1]  # the slower machine is not its cost


def test_older_live_frames_cost_like_fewer_of_them() -> None:
    live, t = Live(), [0.0]
    budget = Budget(
        live, max_cost=0.05, every=1, period_s=2.0, rebase_periods=100, start=t[0],
        live_ages=lambda: live.ages,
    )  # fmt: skip
    run(budget, live, 30.0, 1, t)  # the baseline: 50 ms a frame
    live.age_s = 0.08
    # The same rate, but frames 60 % older: over the budget, it backs off.
    assert run(budget, live, 30.0, 1, t) == [2]
    report = budget.report()
    assert (report["baseline_age_ms"], report["live_age_ms"]) == (50.0, 80.0)
    assert report["live_cost"] == 0.6 and report["throttled"]
    live.age_s = 0.0505  # 1 % older: under half the budget, three periods in a row
    assert run(budget, live, 30.0, 3, t) == [2, 2, 1]
