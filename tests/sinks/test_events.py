"""EventDetector: counts that grow, classes that come and go, and a real workflow's
results (contours → track → line_counter) turned into line_crossed events."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import pytest

from pipelines.types import Detections, FrameResult
from sinks.mqtt.events import EventDetector, event_message
from tests.blocks.tracking_clips import frame, instantiate, render

IMAGE = np.zeros((4, 4, 3), np.uint8)


def result(seq: int, **outputs: Any) -> FrameResult:
    return FrameResult("cam", seq, None, 100.0 + seq, 0.0, 0.0, 0.0, IMAGE, outputs)


def feed(detector: EventDetector, *outputs: Mapping[str, Any]) -> list[list[dict[str, Any]]]:
    return [detector.feed(result(i, **o)) for i, o in enumerate(outputs)]


def people(*names: str) -> Detections:
    labels = sorted(set(names))
    ids = [labels.index(n) for n in names]
    return Detections.from_arrays(np.zeros((len(ids), 4)), [0.9] * len(ids), ids, labels)


def test_line_counter_growth_is_line_crossed_and_total_makes_none() -> None:
    door = [
        {"in": 0, "out": 0, "total": 0},  # the baseline
        {"in": 0, "out": 0, "total": 0},
        {"in": 2, "out": 0, "total": 2},
        {"in": 2, "out": 1, "total": 3},
    ]
    out = feed(EventDetector(), *({"door": d} for d in door))
    assert out[:2] == [[], []]
    assert out[2] == [
        {"type": "line_crossed", "output": "door", "key": "in", "value": 2, "delta": 2}
    ]
    assert out[3] == [
        {"type": "line_crossed", "output": "door", "key": "out", "value": 1, "delta": 1}
    ]


def test_zone_counter_entries_and_exits() -> None:
    zone = [
        {"inside": 0, "entered": 0, "exited": 0},
        {"inside": 1, "entered": 1, "exited": 0},
        {"inside": 0, "entered": 1, "exited": 1},
    ]
    out = feed(EventDetector(), *({"queue": z} for z in zone))
    assert [[(e["type"], e["key"], e["value"]) for e in f] for f in out] == [
        [],
        [("zone_entered", "entered", 1)],
        [("zone_left", "exited", 1)],
    ]


def test_a_reset_counter_moves_the_baseline_without_events() -> None:
    door = [{"in": 5, "out": 0, "total": 5}, {"in": 0, "out": 0, "total": 0}]
    door.append({"in": 1, "out": 0, "total": 1})
    out = feed(EventDetector(), *({"door": d} for d in door))
    assert out[1] == [] and [e["delta"] for e in out[2]] == [1]


def test_other_counts_change_either_way_and_bools_are_not_counts() -> None:
    out = feed(
        EventDetector(),
        {"n": {"cars": 3}, "flags": {"busy": False}},
        {"n": {"cars": 1}, "flags": {"busy": True}},
    )
    assert out[1] == [
        {"type": "count_changed", "output": "n", "key": "cars", "value": 1, "delta": -2}
    ]


def test_classes_appear_at_once_and_disappear_after_a_run_of_absences() -> None:
    frames = [people("person"), people("person", "dog"), people("person")]
    frames += [people("person", "dog")] + [people()] * 3  # dog missing once: no event
    out = feed(EventDetector(absent_results=2), *({"objs": d} for d in frames))
    kinds = [[(e["type"], e["class"]) for e in f] for f in out]
    assert kinds == [
        [("class_appeared", "person")],
        [("class_appeared", "dog")],
        [],
        [],
        [],
        [("class_disappeared", "dog"), ("class_disappeared", "person")],
        [],
    ]


def test_classes_without_labels_are_their_ids() -> None:
    dets = Detections.from_arrays(np.zeros((1, 4)), [0.9], [3])
    assert feed(EventDetector(), {"objs": dets})[0] == [
        {"type": "class_appeared", "output": "objs", "class": "3"}
    ]


def test_event_message_says_where_and_when() -> None:
    event = {"type": "class_appeared", "output": "objs", "class": "dog"}
    assert event_message(result(7), event) == {
        "v": 1,
        "stream": "cam",
        "seq": 7,
        "capture_time": 107.0,
        "captured_at": "1970-01-01T00:01:47.000Z",
        **event,
    }


def test_absent_results_must_be_positive() -> None:
    with pytest.raises(ValueError):
        EventDetector(absent_results=0)


def test_real_workflow_results_make_one_event_per_crossing() -> None:
    # A white square sweeps right, then left, across a vertical line at x=80 (as in
    # tests/blocks/test_line_counter.py): one "out" crossing, then one "in".
    doc = {
        "name": "door",
        "blocks": [
            {"id": "blobs", "type": "contours"},
            {"id": "tracks", "type": "track", "detections": "blobs"},
            {
                "id": "door",
                "type": "line_counter",
                "tracks": "tracks",
                "line": [[80, 10], [80, 110]],
                "units": "px",
                "anchor": "center",
            },
        ],
        "outputs": {"counts": "door", "objects": "tracks"},
    }
    run = instantiate(doc)
    detector = EventDetector()
    events: list[dict[str, Any]] = []
    xs = [*range(30, 131, 5), *range(125, 29, -5)]  # px, 5 px per frame
    for i, x in enumerate(xs):
        image = render([(x - 8, 52, x + 8, 68)])
        events += detector.feed(run.run(frame(image, i)))
    crossings = [(e["key"], e["value"]) for e in events if e["type"] == "line_crossed"]
    assert crossings == [("out", 1), ("in", 1)]
    assert [e["type"] for e in events if e["type"].startswith("class")] == ["class_appeared"]
