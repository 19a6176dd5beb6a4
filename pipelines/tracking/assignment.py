"""Thresholded minimum-cost assignment: which track takes which detection.

ByteTrack calls `lap.lapjv(cost, extend_cost=True, cost_limit=thresh)`. That minimises
Σ cost(matched) + thresh/2 per unmatched row or column, so a pair is only worth matching
when its cost is below `thresh`. The same optimum comes from an ordinary rectangular
assignment on costs clipped at `thresh`, keeping only pairs strictly below it (each clipped
pair costs exactly what leaving both ends unmatched would). We solve that with a small
Hungarian algorithm (Kuhn-Munkres with potentials, O(n²m), inner loop vectorised) after
dropping rows and columns that have no candidate: per frame most tracks have one or no
candidate, and those pairs are settled before the solver runs. No scipy/lap dependency.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from pipelines.tracking.boxes import F64

Ints = npt.NDArray[np.intp]


def match(cost: F64, thresh: float) -> tuple[Ints, Ints]:
    """Row and column indices of the optimal pairs with cost < thresh."""
    gate = cost < thresh
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
    r2, c2 = _rectangular(sub)
    keep = sub[r2, c2] < thresh
    r = np.concatenate([rows[r1], rows[left_r[r2[keep]]]])
    c = np.concatenate([cols[c1], cols[left_c[c2[keep]]]])
    order = np.argsort(r, kind="stable")
    return r[order], c[order]


def _rectangular(cost: F64) -> tuple[Ints, Ints]:
    """Minimum-cost assignment of min(n, m) pairs of an (n, m) matrix."""
    if cost.shape[0] > cost.shape[1]:
        c, r = _hungarian(cost.T)
        order = np.argsort(r)
        return r[order], c[order]
    return _hungarian(cost)


def _hungarian(cost: F64) -> tuple[Ints, Ints]:
    """Kuhn-Munkres with row/column potentials for n <= m (every row gets a column).

    Column 0 is a virtual start column, so arrays are indexed 1..m for real columns and
    `owner[j]` is the 1-based row holding column j (0 = free).
    """
    n, m = cost.shape
    u = np.zeros(n + 1)
    v = np.zeros(m + 1)
    owner = np.zeros(m + 1, np.intp)
    way = np.zeros(m + 1, np.intp)
    for i in range(1, n + 1):
        owner[0] = i
        j0 = 0
        slack = np.full(m + 1, np.inf)
        used = np.zeros(m + 1, bool)
        while owner[j0] != 0:  # owner[0] = i, so the loop runs at least once
            used[j0] = True
            i0 = owner[j0]
            reduced = cost[i0 - 1] - u[i0] - v[1:]
            better = ~used[1:] & (reduced < slack[1:])
            slack[1:][better] = reduced[better]
            way[1:][better] = j0
            free = np.flatnonzero(~used[1:]) + 1
            j1 = int(free[np.argmin(slack[free])])
            delta = slack[j1]
            u[owner[used]] += delta
            v[used] -= delta
            slack[~used] -= delta
            j0 = j1
        while j0:  # flip the augmenting path back to the start column
            j1 = int(way[j0])
            owner[j0] = owner[j1]
            j0 = j1
    cols = np.flatnonzero(owner[1:]) + 1
    rows = owner[cols] - 1
    order = np.argsort(rows)
    return rows[order], cols[order] - 1
