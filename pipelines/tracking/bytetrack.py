"""ByteTrack (Zhang et al., ECCV 2022): associate every detection box, not only the
confident ones.

Per frame, after a Kalman prediction of every track:
1. confirmed tracks (tracked or lost) ↔ high-score boxes, cost 1 − IoU·score;
2. tracks still unmatched that were tracked last frame ↔ low-score boxes, cost 1 − IoU
   (occluded or blurred objects score low but are still where the track predicts);
3. unconfirmed tracks ↔ the high-score boxes left; unmatched unconfirmed tracks die;
4. high-score boxes left with score ≥ birth_threshold start new tracks;
5. tracks unseen for more than `track_buffer` frames are dropped.

This follows `yolox/tracker/byte_tracker.py` of the reference implementation (MIT) with
three deliberate differences: tracks live in a struct of arrays so prediction, IoU and the
Kalman update run batched; a track gets its public id only when confirmed (after
`min_hits` consecutive matches), so ids are dense 1, 2, 3, ... per tracker; and the
tracked/lost duplicate pruning step is left out (rare, and it can steal an old id).

Why not a maintained package: `supervision` (pulls matplotlib), `boxmot` (torch) and
`lap` (a compiled extension for one function) all exceed our dependency budget for ~200
lines of numpy. The assignment is SciPy's, a dependency already (assignment.py).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from pipelines.tracking import kalman
from pipelines.tracking.assignment import Ints, match
from pipelines.tracking.boxes import F64, AnyFloat, iou_matrix, xyah_to_xyxy, xyxy_to_xyah
from pipelines.types import Detections

I64 = npt.NDArray[np.int64]


@dataclass(frozen=True, slots=True)
class TrackerConfig:
    """ByteTrack's knobs; the reference defaults in its terms are noted per field."""

    high_threshold: float = 0.5  # track_thresh: first-stage boxes score above this
    low_threshold: float = 0.1  # second-stage boxes score above this (and ≤ high)
    birth_threshold: float = 0.6  # det_thresh = track_thresh + 0.1: new tracks
    match_iou: float = 0.2  # stage 1 needs IoU·score > this (match_thresh 0.8 = 1 − 0.2)
    low_match_iou: float = 0.5  # stage 2 needs IoU > this (reference: cost 0.5)
    new_match_iou: float = 0.3  # stage 3 needs IoU·score > this (reference: cost 0.7)
    track_buffer: int = 30  # frames a lost track is kept for re-identification
    min_hits: int = 2  # consecutive matches before a track is confirmed and output
    max_tracks: int = 1000  # live (tracked + lost) tracks; no births beyond it


@dataclass(slots=True)
class _Tracks:
    """Struct of arrays, one row per live track. `ids` is 0 until confirmed."""

    mean: F64 = dataclasses.field(default_factory=lambda: np.zeros((0, 8)))
    cov: F64 = dataclasses.field(default_factory=lambda: np.zeros((0, 8, 8)))
    ids: I64 = dataclasses.field(default_factory=lambda: np.zeros(0, np.int64))
    hits: I64 = dataclasses.field(default_factory=lambda: np.zeros(0, np.int64))
    last_seen: I64 = dataclasses.field(default_factory=lambda: np.zeros(0, np.int64))

    def keep(self, rows: npt.NDArray[np.bool_]) -> None:
        if rows.all():  # the usual frame: every track stays, no copies
            return
        self.mean, self.cov = self.mean[rows], self.cov[rows]
        self.ids, self.hits, self.last_seen = self.ids[rows], self.hits[rows], self.last_seen[rows]

    def append(self, xyah: F64, frame: int) -> None:
        mean, cov = kalman.initiate(xyah)
        n = xyah.shape[0]
        self.mean = np.concatenate([self.mean, mean])
        self.cov = np.concatenate([self.cov, cov])
        self.ids = np.concatenate([self.ids, np.zeros(n, np.int64)])
        self.hits = np.concatenate([self.hits, np.ones(n, np.int64)])
        self.last_seen = np.concatenate([self.last_seen, np.full(n, frame, np.int64)])


class ByteTracker:
    """One stream's tracker: `update(detections)` once per frame, in frame order."""

    def __init__(self, config: TrackerConfig = TrackerConfig()) -> None:
        self.config = config
        self.frame = 0
        self._next_id = 1
        self._t = _Tracks()

    def update(self, dets: Detections) -> Detections:
        """The boxes of `dets` that belong to confirmed tracks, with their tracker_id."""
        self.frame += 1
        self._prune()
        self._predict()
        rows, det_rows, unclaimed = self._associate_all(dets)
        self._correct(rows, dets.xyxy[det_rows])
        born = self._births(dets, unclaimed)
        rows = np.concatenate([rows, np.arange(len(self._t.ids) - born.size, len(self._t.ids))])
        det_rows = np.concatenate([det_rows, born])
        self._confirm(rows, det_rows)
        out_ids = self._t.ids[rows]
        shown = out_ids > 0
        order = np.argsort(det_rows[shown], kind="stable")
        picked_rows, ids = det_rows[shown][order], out_ids[shown][order]
        # Detection rows are unique, so as many as there are boxes means every box, in
        # order: the usual frame, where one validated copy is enough.
        picked = dets if picked_rows.size == len(dets) else dets.select(picked_rows)
        return dataclasses.replace(picked, tracker_id=ids)

    def _prune(self) -> None:
        """Drop tentative tracks unmatched last frame and tracks lost too long."""
        t = self._t
        unseen = self.frame - 1 - t.last_seen  # whole frames without a match
        t.keep((unseen <= self.config.track_buffer) & ((t.ids > 0) | (unseen == 0)))

    def _predict(self) -> None:
        t = self._t
        lost = t.last_seen < self.frame - 1
        t.mean[lost, 7] = 0.0  # a lost track stops growing or shrinking (reference quirk)
        t.mean, t.cov = kalman.predict(t.mean, t.cov)

    def _associate_all(self, dets: Detections) -> tuple[Ints, Ints, Ints]:
        """ByteTrack's three stages: matched track rows, their detection rows, and the
        confident detections left unclaimed."""
        t, cfg = self._t, self.config
        boxes = xyah_to_xyxy(t.mean)
        conf = dets.confidence.astype(np.float64)
        high = np.flatnonzero(conf > cfg.high_threshold)
        low = np.flatnonzero((conf > cfg.low_threshold) & (conf <= cfg.high_threshold))
        confirmed = np.flatnonzero(t.ids > 0)
        # Stage 1: confirmed (tracked and lost) tracks take the confident boxes.
        r1, d1 = _associate(boxes, confirmed, dets.xyxy, high, conf, cfg.match_iou)
        # Stage 2: tracks seen last frame but unmatched now take the weak boxes.
        tracked = confirmed[t.last_seen[confirmed] == self.frame - 1]
        r2, d2 = _associate(
            boxes, _without(tracked, r1, len(t.ids)), dets.xyxy, low, None, cfg.low_match_iou
        )
        # Stage 3: tentative tracks take confident boxes nobody claimed.
        left = _without(high, d1, len(dets))
        unconfirmed = np.flatnonzero(t.ids == 0)
        r3, d3 = _associate(boxes, unconfirmed, dets.xyxy, left, conf, cfg.new_match_iou)
        rows, det_rows = np.concatenate([r1, r2, r3]), np.concatenate([d1, d2, d3])
        return rows, det_rows, _without(left, d3, len(dets))

    def _correct(self, rows: Ints, xyxy: npt.NDArray[np.float32]) -> None:
        t = self._t
        if rows.size:
            t.mean[rows], t.cov[rows] = kalman.update(t.mean[rows], t.cov[rows], xyxy_to_xyah(xyxy))
        t.last_seen[rows] = self.frame
        t.hits[rows] += 1

    def _births(self, dets: Detections, unclaimed: Ints) -> Ints:
        """Start tracks for confident unclaimed boxes, most confident first while there is
        room under max_tracks; returns their detection rows (new tracks are appended)."""
        if unclaimed.size == 0:  # the usual frame: every confident box was claimed
            return unclaimed
        conf = dets.confidence[unclaimed]
        born = unclaimed[conf >= self.config.birth_threshold]
        room = max(0, self.config.max_tracks - len(self._t.ids))
        if born.size > room:
            born = np.sort(born[np.argsort(-dets.confidence[born], kind="stable")[:room]])
        if born.size:
            self._t.append(xyxy_to_xyah(dets.xyxy[born]), self.frame)
        return born

    def _confirm(self, rows: Ints, det_rows: Ints) -> None:
        """Give ids to tracks reaching min_hits, in detection order (deterministic)."""
        t = self._t
        ready = (t.ids[rows] == 0) & (t.hits[rows] >= self.config.min_hits)
        if ready.any():
            new = rows[ready][np.argsort(det_rows[ready], kind="stable")]
            t.ids[new] = np.arange(self._next_id, self._next_id + new.size)
            self._next_id += int(new.size)


def _associate(
    boxes: F64, rows: Ints, det_xyxy: AnyFloat, cols: Ints, conf: F64 | None, min_sim: float
) -> tuple[Ints, Ints]:
    """Optimal track rows ↔ detection cols with IoU (× score when given) > min_sim."""
    if rows.size == 0 or cols.size == 0:
        return np.zeros(0, np.intp), np.zeros(0, np.intp)
    sim = iou_matrix(boxes[rows], det_xyxy[cols])
    if conf is not None:
        sim *= conf[cols][None, :]  # ByteTrack's fuse_score
    r, c = match(1.0 - sim, 1.0 - min_sim)
    return rows[r], cols[c]


def _without(rows: Ints, taken: Ints, n: int) -> Ints:
    """`rows` minus `taken` (indices below n), order kept; cheaper than np.setdiff1d."""
    mask = np.ones(n, bool)
    mask[taken] = False
    return rows[mask[rows]]
