"""`track`: ByteTrack on box sequences whose truth we know, plus its solver and filter."""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from pipelines.blocks.base import BuildContext
from pipelines.blocks.track import TrackBlock, TrackParams
from pipelines.tracking import kalman
from pipelines.tracking.assignment import match
from pipelines.tracking.boxes import xyxy_to_xyah
from pipelines.tracking.bytetrack import ByteTracker, TrackerConfig
from pipelines.types import Detections
from tests.blocks.tracking_clips import Box, dets, doc_example, frame, instantiate, render


def box(x: float, y: float, w: float = 30, h: float = 40) -> Box:
    return (x, y, x + w, y + h)


def run(tracker: ByteTracker, frames: Sequence[Detections]) -> list[Detections]:
    return [tracker.update(d) for d in frames]


def ids_where(out: Sequence[Detections], y1: float) -> list[int]:
    """The tracker id of the box whose top edge is at y1, in every frame it is output."""
    found = []
    for tracks in out:
        assert tracks.tracker_id is not None
        found += [int(i) for b, i in zip(tracks.xyxy, tracks.tracker_id, strict=True) if b[1] == y1]
    return found


def test_two_objects_crossing_paths_keep_their_ids() -> None:
    # A goes right, B goes left, 4 px apart vertically (IoU 0.82 as they pass): only the
    # Kalman velocities tell them apart; with positions alone the ids swap.
    frames = [dets(box(10 + 4 * f, 40), box(130 - 4 * f, 44)) for f in range(31)]
    out = run(ByteTracker(), frames)
    a, b = ids_where(out, 40), ids_where(out, 44)
    assert len(a) == len(b) == 30  # confirmed on the 2nd frame (min_hits=2), then always
    assert set(a) == {1} and set(b) == {2}


def test_missed_frames_within_track_buffer_keep_the_id() -> None:
    path = [dets(box(10 + 3 * f, 40)) for f in range(40)]
    gap = [d if not 10 <= f < 18 else Detections.empty() for f, d in enumerate(path)]
    kept = run(ByteTracker(), gap)
    assert [len(t) for t in kept[10:18]] == [0] * 8
    assert ids_where(kept, 40) == [1] * (39 - 8)
    # The same gap with a 5-frame buffer: the track is gone, the object gets a new id.
    short = run(ByteTracker(TrackerConfig(track_buffer=5)), gap)
    assert set(ids_where(short[18:], 40)) == {2}


def test_new_objects_get_new_increasing_ids_from_one() -> None:
    frames = [dets(box(10, 10)) for _ in range(5)]
    frames += [dets(box(10, 10), box(100, 60)) for _ in range(5)]
    frames += [dets(box(100, 60)) for _ in range(40)]  # A leaves for good
    frames += [dets(box(10, 10), box(100, 60)) for _ in range(3)]  # A again: new track
    out = run(ByteTracker(), frames)
    assert ids_where(out, 10) == [1] * 9 + [3] * 2
    assert set(ids_where(out, 60)) == {2}


def test_low_score_boxes_extend_tracks_but_never_start_them() -> None:
    scores = [0.9] * 5 + [0.3] * 10 + [0.9] * 5
    frames = [dets(box(10 + 3 * f, 40), box(100, 80), conf=[s, 0.3]) for f, s in enumerate(scores)]
    out = run(ByteTracker(), frames)
    assert ids_where(out, 40) == [1] * 19  # the 0.3 boxes are output under id 1
    assert [round(float(t.confidence[0]), 2) for t in out[5:15]] == [0.3] * 10
    assert ids_where(out, 80) == []  # a 0.3 box alone never becomes a track
    # Control: with the second stage starved (low boxes below low_threshold), nothing
    # carries the track through the weak frames.
    starved = run(ByteTracker(TrackerConfig(low_threshold=0.35)), frames)
    assert [len(t) for t in starved[5:15]] == [0] * 10


def test_birth_needs_birth_threshold_but_matching_does_not() -> None:
    frames = [dets(box(10, 10), conf=0.55) for _ in range(5)]  # above high, below birth
    assert all(len(t) == 0 for t in run(ByteTracker(), frames))
    rising = [dets(box(10, 10), conf=0.9), *frames]
    assert ids_where(run(ByteTracker(), rising), 10) == [1] * 5


@pytest.mark.parametrize("min_hits", [1, 2, 3])
def test_min_hits_delays_output_and_blips_consume_no_id(min_hits: int) -> None:
    blip = [dets(box(100, 80)), Detections.empty()]  # one frame of a false positive
    frames = blip + [dets(box(10, 10)) for _ in range(5)]
    out = run(ByteTracker(TrackerConfig(min_hits=min_hits)), frames)
    first = 2 + min_hits - 1
    assert [len(t) for t in out[2:]] == [0] * (min_hits - 1) + [1] * (6 - min_hits)
    expected_id = 2 if min_hits == 1 else 1  # with min_hits=1 the blip was a real track
    assert ids_where(out[first:], 10) == [expected_id] * (7 - first)


def test_a_tentative_track_missing_one_frame_dies() -> None:
    # Seen, missed, seen again at the same place: the second sighting starts over, so
    # with min_hits=2 it is output only on the frame after it.
    frames = [dets(box(10, 10)), Detections.empty(), dets(box(10, 10)), dets(box(10, 10))]
    assert [len(t) for t in run(ByteTracker(), frames)] == [0, 0, 0, 1]


def test_output_keeps_the_detections_rows_names_and_scores() -> None:
    d = Detections.from_arrays(
        [box(10, 10), box(80, 10), box(10, 70)], [0.8, 0.95, 0.7], [2, 0, 1], ("a", "b", "c")
    )
    tracker = ByteTracker(TrackerConfig(min_hits=1))
    out = tracker.update(d)
    np.testing.assert_array_equal(out.xyxy, d.xyxy)
    np.testing.assert_array_equal(out.confidence, d.confidence)
    assert out.class_name == ("c", "a", "b")
    assert out.tracker_id is not None and out.tracker_id.tolist() == [1, 2, 3]


def test_max_tracks_caps_births_keeping_the_most_confident() -> None:
    d = dets(box(0, 0), box(50, 0), box(100, 0), conf=[0.7, 0.95, 0.8])
    out = ByteTracker(TrackerConfig(min_hits=1, max_tracks=2)).update(d)
    assert out.xyxy[:, 0].tolist() == [50.0, 100.0]


def test_each_stream_gets_its_own_tracker_through_the_compiler() -> None:
    doc = {
        "blocks": [
            {"id": "blobs", "type": "contours"},
            {"id": "tracks", "type": "track", "detections": "blobs", "min_hits": 1},
        ],
        "outputs": {"tracks": "tracks"},
    }
    one, two = instantiate(doc), instantiate(doc)
    a = render([box(10, 10)])
    ab = render([box(10, 10), box(100, 60)])
    assert one.run(frame(ab, 0)).outputs["tracks"].tracker_id.tolist() == [1, 2]
    assert two.run(frame(a, 0)).outputs["tracks"].tracker_id.tolist() == [1]
    assert one.run(frame(ab, 1)).outputs["tracks"].tracker_id.tolist() == [1, 2]


def test_params_reject_low_above_high_and_derive_birth() -> None:
    with pytest.raises(ValueError, match="low_threshold"):
        TrackParams(low_threshold=0.6, high_threshold=0.5)
    assert TrackParams(high_threshold=0.7).config().birth_threshold == pytest.approx(0.8)
    factory = TrackBlock.build(TrackParams(), BuildContext(models={}))
    assert factory() is not factory()


# -- the solver and the filter ---------------------------------------------------------


def _best_total(cost: np.ndarray, thresh: float) -> float:
    """Brute force: the largest Σ(thresh − cost) over matchings of pairs below thresh."""
    n, m = cost.shape
    best = 0.0
    for k in range(1, min(n, m) + 1):
        for rows in itertools.combinations(range(n), k):
            for cols in itertools.permutations(range(m), k):
                pairs = [cost[r, c] for r, c in zip(rows, cols, strict=True)]
                if max(pairs) < thresh:
                    best = max(best, sum(thresh - p for p in pairs))
    return best


@settings(max_examples=150, deadline=None)
@given(
    arrays(np.float64, st.tuples(st.integers(1, 4), st.integers(1, 5)), elements=st.floats(0, 1)),
    st.floats(0.05, 1.0),
)
def test_match_is_an_optimal_thresholded_assignment(cost: np.ndarray, thresh: float) -> None:
    rows, cols = match(cost, thresh)
    assert len(set(rows.tolist())) == rows.size and len(set(cols.tolist())) == cols.size
    assert np.all(cost[rows, cols] < thresh)
    assert float(np.sum(thresh - cost[rows, cols])) == pytest.approx(_best_total(cost, thresh))


def _reference_filter(z: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """ByteTrack's kalman_filter.py for one track, written out plainly (inverse, loops)."""
    wp, wv = 1 / 20, 1 / 160
    f = np.eye(8)
    f[:4, 4:] = np.eye(4)
    h_mat = np.eye(4, 8)
    h = z[0, 3]
    mean = np.r_[z[0], np.zeros(4)]
    cov = np.diag(
        np.square(
            [2 * wp * h, 2 * wp * h, 1e-2, 2 * wp * h, 10 * wv * h, 10 * wv * h, 1e-5, 10 * wv * h]
        )
    )
    for meas in z[1:]:
        h = mean[3]
        q = np.diag(np.square([wp * h, wp * h, 1e-2, wp * h, wv * h, wv * h, 1e-5, wv * h]))
        mean, cov = f @ mean, f @ cov @ f.T + q
        h = mean[3]
        s = h_mat @ cov @ h_mat.T + np.diag(np.square([wp * h, wp * h, 1e-1, wp * h]))
        gain = cov @ h_mat.T @ np.linalg.inv(s)
        mean = mean + gain @ (meas - h_mat @ mean)
        cov = cov - gain @ s @ gain.T
    return mean, cov


def test_kalman_matches_the_reference_filter_and_learns_velocity() -> None:
    truth = [box(10 + 5 * f, 40 + 2 * f) for f in range(41)]
    z = xyxy_to_xyah(np.asarray(truth, np.float64))
    batch = np.stack([z[:40], z[:40] * 1.5, z[:40] + 7])  # three tracks at once
    means, covs = kalman.initiate(batch[:, 0])
    for f in range(1, 40):
        means, covs = kalman.update(*kalman.predict(means, covs), batch[:, f])
    for i in range(3):
        ref_mean, ref_cov = _reference_filter(batch[i])
        np.testing.assert_allclose(means[i], ref_mean, rtol=1e-9, atol=1e-12)
        np.testing.assert_allclose(covs[i], ref_cov, rtol=1e-9, atol=1e-12)
    assert means[0, 4:6] == pytest.approx([5.0, 2.0], abs=0.05)  # px/frame
    ahead, _ = kalman.predict(means[:1], covs[:1])
    assert ahead[0, :4] == pytest.approx(z[40], abs=0.1)  # the next box, to 0.1 px


def test_the_documented_example_compiles_and_runs() -> None:
    run = instantiate(doc_example("track"))
    moving = [render([(10 + 4 * f, 20, 30 + 4 * f, 60)]) for f in range(3)]
    out = [run.run(frame(img, f)).outputs["tracks"] for f, img in enumerate(moving)]
    assert [t.tracker_id.tolist() for t in out] == [[], [1], [1]]  # min_hits: 2
