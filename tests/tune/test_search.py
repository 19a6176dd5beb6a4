"""The tuner's decisions as pure logic: a scripted target whose windows' fps come from a
table keyed by the settings (times a deterministic drift or wobble), on a fake clock; and
the search space and objective it is built on."""

from __future__ import annotations

import itertools
import json
import threading
from collections.abc import Callable, Mapping
from types import SimpleNamespace
from typing import Any

import pytest

from appliance.config import TuningConfig
from appliance.models.tuned import ModelTuning
from appliance.sources.config import SourceTuning
from appliance.tune import search
from appliance.tune.meter import Meter, Window
from appliance.tune.objective import KEEP_UP, Objective, default_slo_ms
from appliance.tune.report import table
from appliance.tune.results import result_json
from appliance.tune.search import Progress, Tuner, TuneResult, grid
from appliance.tune.space import (
    BATCH_SIZES,
    Hardware,
    Knob,
    Settings,
    model_knobs,
    parse_knob,
    restrict,
    source_knobs,
    thread_counts,
    to_tuning,
)
from pipelines.spec import BatchingSpec, ModelSpec, SessionSpec

FPS = Objective("fps", slo_ms=1000.0)  # every scripted window is far under it: score = fps
BATCH, SPIN, THREADS = "m.max_batch_size", "m.allow_spinning", "sources.decoder_threads"
Table = Mapping[str, Mapping[Any, float]]  # knob key -> value -> factor on the fps


class Clock:
    """A fake monotonic clock: a window takes its seconds, nothing else takes any."""

    def __init__(self) -> None:
        self.t = 1000.0

    def monotonic(self) -> float:
        return self.t


class Scripted:
    """A Target whose window figures are a table lookup: 100 fps times each setting's
    factor, times (1 + drift x the window's index), times `wobble(index, settings)`."""

    def __init__(
        self,
        clock: Clock,
        table: Table,
        *,
        drift: float = 0.0,
        wobble: Callable[[int, Settings], float] | None = None,
        refuse: Callable[[Settings], bool] | None = None,
    ) -> None:
        self.clock, self.table, self.drift = clock, table, drift
        self.wobble, self.refuse = wobble, refuse
        self.current: Settings = {}
        self.applied: list[Settings] = []
        self.measured: list[Settings] = []
        self.fps: list[float] = []

    def apply(self, settings: Settings) -> None:
        if self.refuse is not None and self.refuse(settings):
            raise RuntimeError("the session would not open")
        self.current = dict(settings)
        self.applied.append(dict(settings))

    def measure(self, seconds: float, stop: threading.Event) -> Window | None:
        if stop.is_set():
            return None
        self.clock.t += seconds
        i = len(self.measured)
        fps = 100.0 * (1.0 + self.drift * i)
        for key, value in self.current.items():
            fps *= self.table.get(key, {}).get(value, 1.0)
        if self.wobble is not None:
            fps *= self.wobble(i, self.current)
        self.measured.append(dict(self.current))
        self.fps.append(fps)
        return window(fps)

    def problem(self) -> str | None:
        return None


def window(fps: float, p99_ms: float = 10.0, offered_fps: float = 30.0) -> Window:
    return Window(seconds=1.0, frames=int(fps), fps=fps, p50_ms=p99_ms / 2, p99_ms=p99_ms,
                  offered_fps=offered_fps, slowest_fps=fps / 2)  # fmt: skip


def knob(key: str, values: tuple[Any, ...], start: Any, restarts: bool = False) -> Knob:
    scope, name = key.rsplit(".", 1)
    return Knob(key, scope, name, values, start, restarts)


BATCH_KNOB = knob(BATCH, (1, 2, 4), 1)
SPIN_KNOB = knob(SPIN, (True, False), True)
THREADS_KNOB = knob(THREADS, (0, 1, 2, 3), 0, restarts=True)


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    """The search's clock is this fake one: the budget counts the scripted windows."""
    fake = Clock()
    monkeypatch.setattr(search, "time", SimpleNamespace(monotonic=fake.monotonic))
    return fake


def tuner(target: Scripted, knobs: list[Knob], **options: Any) -> Tuner:
    options = {"window_s": 5.0, "settle_s": 0.0, **options}
    return Tuner(target, knobs, FPS, **options)


def candidate(result: TuneResult, key: str, value: Any) -> search.Candidate:
    [found] = [c for c in result.candidates if c.knob == key and c.value == value]
    return found


# -- the descent ---------------------------------------------------------------------------


def test_a_clearly_better_value_is_adopted_and_the_next_knob_starts_from_it(
    clock: Clock,
) -> None:
    target = Scripted(clock, {BATCH: {1: 1.0, 2: 1.1, 4: 1.3}, SPIN: {True: 1.0, False: 1.0}})

    result = tuner(target, [BATCH_KNOB, SPIN_KNOB]).run()

    assert result.outcome == "done" and result.problem is None
    assert result.best == {BATCH: 4, SPIN: True}
    assert result.changed == {BATCH: 4}
    assert candidate(result, BATCH, 4).verdict == "adopted"
    assert candidate(result, BATCH, 2).verdict == "better"  # better, but not the best
    assert result.reasons[BATCH].startswith("4 over 1: score ×1.300")
    # A B A B A C A C A: each better value confirmed by a second pair before it counts.
    assert [s[BATCH] for s in target.measured[:9]] == [1, 2, 1, 2, 1, 4, 1, 4, 1]
    assert len(candidate(result, BATCH, 4).ratios) == 4
    # The next knob's windows (its A and its candidates) all run on the winner.
    spin_windows = target.measured[9:]
    assert spin_windows and all(s[BATCH] == 4 for s in spin_windows)
    assert candidate(result, SPIN, False).settings == {BATCH: 4, SPIN: False}
    assert result.reasons[SPIN].startswith("kept True")


def test_a_value_within_the_noise_is_never_adopted(clock: Clock) -> None:
    # The best-so-far's windows wobble by ±4 %, the candidates are 1-3 % better: each
    # candidate's ratios straddle 1, whatever its median.
    target = Scripted(
        clock,
        {BATCH: {1: 1.0, 2: 1.01, 4: 1.03}},
        wobble=lambda i, s: 1.0 if s[BATCH] != 1 else (0.96, 1.04)[(i // 2) % 2],
    )

    result = tuner(target, [BATCH_KNOB]).run()

    assert result.outcome == "done"
    assert result.best == {BATCH: 1} and result.changed == {}
    for c in result.candidates:
        low, high = c.interval
        assert low < 1.0 < high, c.ratios
        assert c.verdict == "tie"
    assert candidate(result, BATCH, 4).median > 1.02  # a lone ratio would have crowned it
    assert result.reasons[BATCH].startswith("kept 1: no value beat it beyond the noise")


@pytest.mark.parametrize("max_repeats", [1, 2, 3])
def test_a_slightly_better_noisy_candidate_is_measured_again_at_most_max_repeats_times(
    clock: Clock, max_repeats: int
) -> None:
    # A alternates 100 and 110 fps, B runs at 108: ratios 1.08 and 0.98 each pair, a near
    # tie whose median (1.03) says better while its interval reaches below 1: it is worth
    # repeating, but no repeat makes it a winner.
    target = Scripted(
        clock,
        {BATCH: {1: 1.0, 2: 1.08}},
        wobble=lambda i, s: 1.0 if s[BATCH] != 1 else (1.0, 1.1)[(i // 2) % 2],
    )
    knobs = [knob(BATCH, (1, 2), 1)]

    result = tuner(target, knobs, max_repeats=max_repeats).run()

    [c] = result.candidates
    assert c.verdict == "tie" and result.best == {BATCH: 1}
    assert len(c.windows) == 1 + max_repeats  # one pair, then max_repeats more
    assert len(c.ratios) == 2 * (1 + max_repeats)
    assert result.windows == 1 + 2 * (1 + max_repeats)
    assert target.measured == [{BATCH: v} for v in [1, *[2, 1] * (1 + max_repeats)]]


def test_a_tie_close_to_one_is_not_repeated(clock: Clock) -> None:
    target = Scripted(clock, {BATCH: {1: 1.0, 2: 1.004}}, drift=0.01)

    result = tuner(target, [knob(BATCH, (1, 2), 1)], max_repeats=3).run()

    [c] = result.candidates
    assert c.verdict == "tie" and len(c.windows) == 1 and result.windows == 3


def test_a_drift_does_not_make_an_equal_candidate_a_winner(clock: Clock) -> None:
    # Every window is 4 % faster than the one before it (the machine warming up): each
    # candidate's own window beats the A before it, but not the A after it.
    target = Scripted(clock, {}, drift=0.04)
    knobs = [BATCH_KNOB, SPIN_KNOB]

    result = tuner(target, knobs).run()

    assert result.outcome == "done"
    assert result.best == {BATCH: 1, SPIN: True} and result.changed == {}
    for c in result.candidates:
        assert c.ratios[0] > 1.02  # alone against the window before: "better"
        assert c.ratios[1] < 1.0  # the A after it, measured later, says otherwise
        assert c.verdict == "tie"
    # A B A C A per knob: the windows alternate the best-so-far with each candidate.
    assert [s[BATCH] for s in target.measured[:5]] == [1, 2, 1, 4, 1]


def test_a_worse_value_is_judged_worse(clock: Clock) -> None:
    target = Scripted(clock, {BATCH: {1: 1.0, 2: 0.8, 4: 0.6}})

    result = tuner(target, [BATCH_KNOB]).run()

    assert {c.value: c.verdict for c in result.candidates} == {2: "worse", 4: "worse"}
    assert result.best == {BATCH: 1}


def test_windows_are_2n_minus_1_per_knob_plus_a_confirmation_less_a_shared_a_window(
    clock: Clock,
) -> None:
    target = Scripted(clock, {BATCH: {4: 1.5}, THREADS: {1: 0.7, 2: 0.8, 3: 0.9}})
    knobs = [BATCH_KNOB, SPIN_KNOB, THREADS_KNOB]
    seen: list[Progress] = []

    result = tuner(target, knobs, on_progress=seen.append).run()

    estimate = sum(2 * len(k.values) - 1 for k in knobs)
    assert estimate == 5 + 3 + 7
    # Two windows more: batch size 4's confirming pair. One fewer: the spinning knob ends
    # on the best so far, so the threads knob starts from that A window.
    total = estimate + 2 - 1
    assert result.windows == total == len(target.measured)
    assert result.outcome == "done" and result.best[BATCH] == 4
    # measured + left: the estimate, plus the confirmation once it is due, then exact.
    assert [p.windows for p in seen] == list(range(total))
    assert all(p.windows + p.windows_left in (estimate, estimate + 2, total) for p in seen)
    assert seen[-1].windows + seen[-1].windows_left == total
    assert seen[0].current == "best so far" and seen[1].current == f"{BATCH}=2"
    # Only changes are applied: a window on the settings already applied applies nothing.
    assert len(target.applied) == sum(
        1 for i, s in enumerate(target.measured) if i == 0 or s != target.measured[i - 1]
    )


def test_the_budget_ends_the_run_with_the_best_so_far(clock: Clock) -> None:
    target = Scripted(clock, {BATCH: {4: 1.3}, SPIN: {False: 1.3}})
    # Knob 1 costs 7 windows of 5 s (its winner confirmed by a second pair); the budget
    # leaves room for 2 of knob 2's 3.
    result = tuner(target, [BATCH_KNOB, SPIN_KNOB], budget_s=46.0).run()

    assert result.outcome == "budget" and result.problem is None
    assert result.windows == 9 and clock.t - 1000.0 <= 46.0
    assert result.best == {BATCH: 4, SPIN: True}  # knob 1's winner; knob 2 unfinished
    assert set(result.reasons) == {BATCH}
    assert candidate(result, SPIN, False).verdict == "pending"  # measured once, unjudged


def test_the_stop_event_interrupts_the_run(clock: Clock) -> None:
    stop = threading.Event()

    def progress(p: Progress) -> None:
        if p.windows == 1:  # the second call: the first candidate is about to be applied
            stop.set()

    target = Scripted(clock, {BATCH: {4: 1.3}})
    result = tuner(target, [BATCH_KNOB, SPIN_KNOB], stop=stop, on_progress=progress).run()

    assert result.outcome == "interrupted" and result.problem is None
    assert result.windows == 1 and len(target.measured) == 1
    assert result.best == {BATCH: 1, SPIN: True} and result.reasons == {}


def test_a_stop_set_during_a_window_applies_nothing_more(clock: Clock) -> None:
    stop = threading.Event()

    class Stopping(Scripted):
        def measure(self, seconds: float, stop_: threading.Event) -> Window | None:
            measured = super().measure(seconds, stop_)
            stop.set()  # as the window ends (Ctrl-C meanwhile): it still counts
            return measured

    target = Stopping(clock, {})
    result = tuner(target, [BATCH_KNOB], stop=stop).run()

    assert result.outcome == "interrupted" and result.windows == 1
    assert target.applied == [{BATCH: 1}]  # the next candidate was never applied
    assert [c.verdict for c in result.candidates] == ["pending"]


def test_a_candidate_that_fails_to_apply_fails_the_run_naming_it(clock: Clock) -> None:
    target = Scripted(clock, {BATCH: {2: 1.3}}, refuse=lambda s: s[SPIN] is False)

    result = tuner(target, [BATCH_KNOB, SPIN_KNOB]).run()

    assert result.outcome == "failed"
    assert result.problem == f"{SPIN}=False: the session would not open"
    failed = candidate(result, SPIN, False)
    assert failed.verdict == "failed" and failed.windows == []
    assert result.best == {BATCH: 2, SPIN: True}  # the first knob's winner stands


def test_grid_measures_every_combination_once_restarting_knobs_outermost(clock: Clock) -> None:
    target = Scripted(clock, {BATCH: {2: 1.2}, THREADS: {1: 1.1}})
    knobs = [BATCH_KNOB, SPIN_KNOB, THREADS_KNOB]
    calls: list[tuple[int, int]] = []

    rows = grid(target, knobs, FPS, window_s=5.0, settle_s=0.0,
                on_window=lambda i, n, s: calls.append((i, n)))  # fmt: skip

    combos = 3 * 2 * 4
    assert len(rows) == combos == len(target.measured)
    assert calls == [(i, combos) for i in range(combos)]
    keys = {tuple(sorted(s.items())) for s, _, _ in rows}
    assert len(keys) == combos
    threads = [s[THREADS] for s, _, _ in rows]
    changes = sum(1 for a, b in itertools.pairwise(threads) if a != b)
    assert changes == len(THREADS_KNOB.values) - 1  # the streams restart 3 times, not 23
    best = max(rows, key=lambda r: r[2])
    assert best[0] == {BATCH: 2, SPIN: True, THREADS: 1}
    assert best[2] == pytest.approx(100 * 1.2 * 1.1)


# -- the space -----------------------------------------------------------------------------


def test_parse_knob_reads_values_as_yaml_and_names_an_unknown_knob() -> None:
    assert parse_knob("max_batch_size=1,2,4") == ("max_batch_size", (1, 2, 4))
    assert parse_knob("faces.allow_spinning=true,false") == ("faces.allow_spinning", (True, False))
    assert parse_knob("max_queue_delay_ms=0,2.5") == ("max_queue_delay_ms", (0, 2.5))
    assert parse_knob("graph_optimization=basic,all") == ("graph_optimization", ("basic", "all"))
    assert parse_knob("sources.decoder_threads") == ("sources.decoder_threads", None)
    with pytest.raises(ValueError, match=r"--knob: unknown knob 'faces\.batch_size'"):
        parse_knob("faces.batch_size=1,2")
    with pytest.raises(ValueError, match=r"tune\.only: unknown knob 'spin'"):
        parse_knob("spin", where="tune.only")
    with pytest.raises(ValueError, match="values are numbers"):
        parse_knob("max_batch_size=1,,2")


def test_restrict_keeps_the_knobs_named_with_their_values_and_the_start() -> None:
    knobs = [
        knob("a.max_batch_size", (1, 2, 4, 8), 4),
        knob("b.max_batch_size", (1, 2, 4, 8), 2),
        knob("a.allow_spinning", (True, False), True),
        THREADS_KNOB,
    ]
    assert restrict(knobs, None) == knobs

    kept = restrict(knobs, {"max_batch_size": (1, 8), "a.allow_spinning": None})

    assert {k.key: k.values for k in kept} == {
        "a.max_batch_size": (1, 8, 4),  # the value in effect stays a candidate
        "b.max_batch_size": (1, 8, 2),
        "a.allow_spinning": (True, False),
    }
    # A model's own key wins over the setting's name for every model.
    [one] = restrict(knobs, {"b.max_batch_size": (16,), "allow_spinning": (False,)})[1:]
    assert one.key == "a.allow_spinning" and one.values == (False, True)
    assert [k.values for k in restrict(knobs, {"b.max_batch_size": (16,)})] == [(16, 2)]


@pytest.mark.parametrize("cores", [1, 2, 3, 4, 6, 8, 16, 64])
def test_thread_counts_stay_between_one_and_the_cores(cores: int) -> None:
    counts = thread_counts(cores)
    assert counts == tuple(sorted(set(counts)))
    assert counts[0] == 1 and counts[-1] == cores
    assert len(counts) <= max(cores, 5)  # a large machine is not swept core by core
    if cores <= 4:
        assert counts == tuple(range(1, cores + 1))


def spec(**batching: Any) -> ModelSpec:
    return ModelSpec(
        path="m.onnx",  # type: ignore[arg-type]
        batching=BatchingSpec(**batching),
        session=SessionSpec(intra_op_threads=0, allow_spinning=False),
    )


def test_model_knobs_leave_batch_size_out_for_a_fixed_batch_model() -> None:
    cpu = Hardware(cores=4)

    free = {k.name: k for k in model_knobs("m", spec(max_batch_size=3), cpu, None)}
    fixed = {k.name: k for k in model_knobs("m", spec(max_batch_size=1), cpu, 1)}

    assert free["max_batch_size"].values == (*BATCH_SIZES, 3)  # the declared one kept
    assert free["max_batch_size"].start == 3 and free["max_batch_size"].key == "m.max_batch_size"
    assert "max_batch_size" not in fixed
    assert fixed["intra_op_threads"].values == (1, 2, 3, 4)
    assert fixed["intra_op_threads"].start == 4  # 0: ORT's own, one per core
    assert fixed["allow_spinning"].start is False
    assert not any(k.restarts for k in fixed.values())
    gpu = {k.name: k for k in model_knobs("m", spec(), Hardware(cores=4, gpu=True), None)}
    assert "intra_op_threads" not in gpu and 32 in gpu["max_batch_size"].values


def test_source_knobs_offer_the_reader_only_for_rtsp_and_restart_streams() -> None:
    files = source_knobs(False, {}, Hardware(cores=2))
    cameras = source_knobs(True, {"decoder_threads": 4}, Hardware(cores=8))

    assert [(k.key, k.values, k.start) for k in files] == [("sources.decoder_threads", (0, 1), 0)]
    assert {k.key: (k.values, k.start) for k in cameras} == {
        "sources.reader": (("auto", "ffmpeg"), "auto"),
        "sources.decoder_threads": ((0, 1, 2, 4), 4),
    }
    assert all(k.restarts for k in [*files, *cameras])


def test_to_tuning_sets_the_settings_over_the_base_and_keeps_its_other_entries() -> None:
    base = TuningConfig(
        models={
            "faces": ModelTuning(max_batch_size=2, allow_spinning=False),
            "other": ModelTuning(intra_op_threads=1),
        },
        sources=SourceTuning(reader="ffmpeg"),
    )
    knobs = [
        knob("faces.max_batch_size", (1, 2, 4), 2),
        knob("person.max_queue_delay_ms", (0.0, 2.0), 2.0),
        knob("sources.decoder_threads", (0, 1), 0, restarts=True),
        knob("faces.intra_op_threads", (1, 2), 2),  # not in the settings: left as it is
    ]
    settings = {"faces.max_batch_size": 4, "person.max_queue_delay_ms": 0.0,
                "sources.decoder_threads": 1}  # fmt: skip

    tuning = to_tuning(base, settings, knobs)

    assert tuning == TuningConfig(
        models={
            "faces": ModelTuning(max_batch_size=4, allow_spinning=False),
            "other": ModelTuning(intra_op_threads=1),
            "person": ModelTuning(max_queue_delay_ms=0.0),
        },
        sources=SourceTuning(reader="ffmpeg", decoder_threads=1),
    )
    assert base.models["faces"].max_batch_size == 2  # the base itself is left alone
    assert to_tuning(base, {}, knobs) == base


# -- the objective -------------------------------------------------------------------------


def test_the_fps_score_is_the_fps_under_the_slo_and_scaled_by_slo_over_p99_above_it() -> None:
    fps = Objective("fps", slo_ms=100.0)

    assert fps.score(window(30.0, p99_ms=80.0)) == pytest.approx(30.0)
    assert fps.score(window(30.0, p99_ms=100.0)) == pytest.approx(30.0)
    assert fps.score(window(30.0, p99_ms=200.0)) == pytest.approx(15.0)
    assert fps.met(window(30.0, p99_ms=100.0)) and not fps.met(window(30.0, p99_ms=101.0))
    # More frames at the same age win; at saturation the fresher of two equal rates wins.
    assert fps.score(window(40.0, p99_ms=300.0)) > fps.score(window(30.0, p99_ms=300.0))
    assert fps.score(window(30.0, p99_ms=150.0)) > fps.score(window(30.0, p99_ms=300.0))
    assert fps.score(Window(1.0, 0, 0.0, float("inf"), float("inf"), 30.0, 0.0)) == 0.0
    assert "100 ms" in fps.describe()


def test_the_latency_score_penalises_not_keeping_up() -> None:
    latency = Objective("latency", slo_ms=100.0)
    kept = window(30.0, p99_ms=50.0, offered_fps=30.0)
    dropped = window(15.0, p99_ms=40.0, offered_fps=30.0)  # fresher, but half the frames

    assert latency.score(kept) == pytest.approx(1000.0 / 50.0)
    assert latency.score(window(30.0, p99_ms=25.0)) == pytest.approx(2 * latency.score(kept))
    assert latency.score(dropped) == pytest.approx(1000.0 / 40.0 * 15.0 / (KEEP_UP * 30.0))
    assert latency.score(dropped) < latency.score(kept)
    assert latency.met(kept) and not latency.met(dropped)
    # Within KEEP_UP of the cameras' rate (a window's edge frames) is keeping up.
    assert latency.score(window(29.5, p99_ms=50.0)) == pytest.approx(latency.score(kept))


def test_the_default_slo_is_two_frame_intervals_of_the_slowest_camera() -> None:
    assert default_slo_ms([15.0, 30.0]) == pytest.approx(2000.0 / 15.0)
    assert default_slo_ms([0.0, 25.0]) == pytest.approx(80.0)
    assert default_slo_ms([]) == 1000.0


def test_a_window_without_frames_is_strict_json_and_reports_without_an_age(clock: Clock) -> None:
    """No result in a window (every stream between two frames): its ages are null, not
    JSON's non-standard Infinity a browser's JSON.parse refuses, and the table says '-'."""
    empty = Meter().window(0.0, 1.0, ["cam"], offered_fps=15.0)
    assert empty.frames == 0 and empty.row()["p99_ms"] is None
    json.dumps(empty.row(), allow_nan=False)
    assert FPS.score(empty) == 0.0
    result = tuner(Scripted(clock, {}), [knob(BATCH, (1, 2), 1)]).run()
    doc = result_json(result)
    doc["candidates"][0]["windows"] = [empty.row()]
    json.dumps(doc, allow_nan=False)
    row = next(line for line in table(doc).splitlines() if line.startswith(f"{BATCH}=2"))
    assert row.split()[-2] == "-"  # its p99 column
