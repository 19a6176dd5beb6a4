"""The shadow's comparison on hand-made detections: matching per class by IoU, the
agreement score, the kept examples, counters and the interval."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from appliance.runtime.comparison import Comparison, f1, match
from pipelines.types import Detections, FrameResult

LABELS = ("person", "car")


def dets(*rows: tuple[float, float, float, float, float, int]) -> Detections:
    """Rows of (x1, y1, x2, y2, confidence, class id)."""
    if not rows:
        return Detections.empty()
    a = np.array(rows, dtype=np.float64)
    return Detections.from_arrays(a[:, :4], a[:, 4], a[:, 5].astype(int), LABELS)


def result(seq: int, run_ms: float = 10.0, **outputs: Any) -> FrameResult:
    return FrameResult(
        stream_id="cam", seq=seq, pts=None, capture_time=0.0, capture_mono=0.0,
        start_mono=1.0, done_mono=1.0 + run_ms / 1e3, image=None, outputs=outputs,
    )  # fmt: skip


PERSON = (10, 10, 50, 90, 0.9, 0)
NEAR_PERSON = (12, 11, 51, 92, 0.8, 0)  # IoU with PERSON about 0.9
CAR = (100, 100, 200, 160, 0.7, 1)
CAR_AS_PERSON = (100, 100, 200, 160, 0.7, 0)


def test_the_same_boxes_match_one_to_one() -> None:
    found = match(dets(PERSON, CAR), dets(NEAR_PERSON, CAR))
    assert (found.matched, found.missed, found.extra) == (2, [], [])


def test_a_box_of_another_class_is_a_miss_and_an_extra() -> None:
    found = match(dets(PERSON, CAR), dets(PERSON, CAR_AS_PERSON))
    assert (found.matched, found.missed, found.extra) == (1, [1], [1])


def test_below_the_iou_threshold_nothing_matches() -> None:
    shifted = (30, 10, 70, 90, 0.9, 0)  # IoU with PERSON: 20*80 / (2*40*80 - 20*80) = 1/3
    assert match(dets(PERSON), dets(shifted), iou=0.5).matched == 0
    assert match(dets(PERSON), dets(shifted), iou=0.3).matched == 1


def test_the_most_confident_candidate_takes_the_box() -> None:
    weak, strong = (10, 10, 50, 90, 0.3, 0), (11, 10, 50, 90, 0.95, 0)
    found = match(dets(PERSON), dets(weak, strong))
    assert (found.matched, found.extra) == (1, [0])  # the weak duplicate is the extra


def test_agreement_counts_misses_and_extras_over_frames() -> None:
    comparison = Comparison()
    comparison.add(result(1, people=dets(PERSON, CAR)), result(1, people=dets(PERSON, CAR)))
    comparison.add(result(2, people=dets(PERSON, CAR)), result(2, people=dets(PERSON)))
    comparison.add(result(3, people=dets()), result(3, people=dets(CAR)))
    report = comparison.report()
    assert (report["frames"], report["matched"], report["missed"], report["extra"]) == (3, 3, 1, 1)
    assert report["agreement"] == round(f1(3, 1, 1), 4) == round(6 / 8, 4)
    low, high = report["agreement_interval"]
    assert low <= report["agreement"] <= high
    examples = report["examples"]  # newest first
    assert [(e["seq"], e["kind"], e["label"]) for e in examples] == [
        (3, "extra", "car"),
        (2, "missed", "car"),
    ]
    assert examples[1]["box"] == [100.0, 100.0, 200.0, 160.0]


def test_nothing_found_on_either_side_agrees() -> None:
    comparison = Comparison()
    comparison.add(result(1, people=dets()), result(1, people=dets()))
    assert comparison.report()["agreement"] == 1.0


def test_counters_compare_their_growth() -> None:
    comparison = Comparison()
    comparison.add(result(1, line={"in": 2, "out": 0}), result(1, line={"in": 0, "out": 0}))
    comparison.add(result(2, line={"in": 5, "out": 1}), result(2, line={"in": 2, "out": 1}))
    counts = comparison.report()["counts"]["line"]
    assert counts["in"] == {"live": 3.0, "candidate": 2.0, "difference": -1.0}
    assert counts["out"] == {"live": 1.0, "candidate": 1.0, "difference": 0.0}


def test_latency_is_compared_frame_by_frame() -> None:
    comparison = Comparison()
    for seq in range(4):
        comparison.add(result(seq, 10.0, people=dets()), result(seq, 25.0, people=dets()))
    latency = comparison.report()["latency_ms"]
    assert latency["live_p50"] == 10.0 and latency["candidate_p50"] == 25.0
    assert latency["ratio_p50"] == 2.5
    assert comparison.report()["cpu_ms"]["live_p50"] is None  # neither measured its CPU


def test_cpu_is_compared_where_both_runs_measured_it() -> None:
    comparison = Comparison()
    for seq in range(4):
        live = dataclasses.replace(result(seq), block_cpu_ns=(1_000_000, 2_000_000))
        candidate = dataclasses.replace(result(seq), block_cpu_ns=(6_000_000, 0))
        comparison.add(live, candidate)
    comparison.add(result(9), result(9))  # not measured: left out of the CPU figures
    cpu = comparison.report()["cpu_ms"]
    assert (cpu["live_p50"], cpu["candidate_p50"], cpu["ratio_p50"]) == (3.0, 6.0, 2.0)


def test_outputs_only_one_side_has_are_not_compared() -> None:
    comparison = Comparison()
    comparison.add(result(1, people=dets(PERSON)), result(1, faces=dets(PERSON)))
    report = comparison.report()
    assert (report["matched"], report["missed"], report["extra"]) == (0, 0, 0)


def test_each_class_is_tallied_on_both_sides() -> None:
    comparison = Comparison()
    comparison.add(result(0, people=dets(PERSON, CAR)), result(0, people=dets(NEAR_PERSON)))
    comparison.add(result(1, people=dets(PERSON)), result(1, people=dets(PERSON, CAR_AS_PERSON)))
    assert comparison.report()["classes"] == {
        "people": {
            "car": {"live": 1, "candidate": 0, "difference": -1},
            "person": {"live": 2, "candidate": 3, "difference": 1},
        }
    }


def test_the_latency_ratio_has_an_interval_over_frames() -> None:
    comparison = Comparison()
    for seq, run_ms in enumerate((20.0, 22.0, 24.0, 26.0, 28.0) * 8):
        comparison.add(result(seq, 10.0, people=dets()), result(seq, run_ms, people=dets()))
    latency = comparison.report()["latency_ms"]
    low, high = latency["ratio_interval"]
    assert low < latency["ratio_p50"] == 2.4 < high and low >= 2.0 and high <= 2.8
    assert comparison.report(interval=False)["latency_ms"]["ratio_interval"] == [None, None]
