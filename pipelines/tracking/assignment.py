"""Thresholded minimum-cost assignment: which track takes which detection.

ByteTrack calls `lap.lapjv(cost, extend_cost=True, cost_limit=thresh)`. That minimises
Σ cost(matched) + thresh/2 per unmatched row or column, so a pair is only worth matching
when its cost is below `thresh`. The same optimum comes from an ordinary rectangular
assignment on costs clipped at `thresh`, keeping only pairs strictly below it (each clipped
pair costs exactly what leaving both ends unmatched would). SciPy's
`linear_sum_assignment` (a C implementation of the shortest augmenting path algorithm)
solves that, after dropping rows and columns that have no candidate: per frame most
tracks have one or no candidate, and those pairs are settled before the solver runs.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt
from scipy.optimize import linear_sum_assignment

from pipelines.tracking.boxes import F64

Ints = npt.NDArray[np.intp]


def match(cost: F64, thresh: float) -> tuple[Ints, Ints]:
    """Row and column indices of the optimal pairs with cost < thresh."""
    gate = cost < thresh
    if gate.sum(axis=1).max() <= 1 and gate.sum(axis=0).max() <= 1:
        # No row or column has two candidates: every pair stands alone and is optimal
        # (the usual frame, people apart); np.nonzero gives them in row order.
        r0, c0 = np.nonzero(gate)
        return r0, c0
    rows = np.flatnonzero(gate.any(axis=1))
    cols = np.flatnonzero(gate.any(axis=0))
    if rows.size == 0:
        return rows, cols
    sub_gate = gate[np.ix_(rows, cols)]
    # Pairs whose row and column have no other candidate are optimal as they stand (an
    # isolated 1×1 component); per frame that is most tracks, so only the rest, the truly
    # contested ones, go to the solver.
    alone = sub_gate & (sub_gate.sum(1)[:, None] == 1) & (sub_gate.sum(0)[None, :] == 1)
    r1, c1 = np.nonzero(alone)
    if r1.size == rows.size:
        return rows[r1], cols[c1]
    left_r = np.flatnonzero(~alone.any(1))
    left_c = np.flatnonzero(~alone.any(0))
    sub = np.minimum(cost[np.ix_(rows[left_r], cols[left_c])], thresh)
    r2, c2 = linear_sum_assignment(sub)  # min(n, m) pairs, rows in order
    keep = sub[r2, c2] < thresh
    r = np.concatenate([rows[r1], rows[left_r[r2[keep]]]])
    c = np.concatenate([cols[c1], cols[left_c[c2[keep]]]])
    order = np.argsort(r, kind="stable")
    return r[order], c[order]
