"""Per-track state for counters, keyed by tracker id and looked up vectorised.

Counters see a few dozen ids per frame out of an unbounded id space, so state lives in
columns sorted by id and `np.searchsorted` finds every row of a frame at once, instead of
a dict lookup per detection. Rows unseen for too long are dropped by `forget`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import numpy.typing as npt

Array = npt.NDArray[Any]
Rows = npt.NDArray[np.intp]


class IdTable:
    """Columns of per-id state; `columns` maps name -> (dtype, initial value for new ids).

    Column arrays are replaced when rows are added or dropped: read them through
    `self.col[name]` after `lookup`, not from a reference kept across calls.
    """

    def __init__(self, columns: Mapping[str, tuple[npt.DTypeLike, Any]]) -> None:
        self._fill = {name: (np.dtype(dt), value) for name, (dt, value) in columns.items()}
        self.ids = np.zeros(0, np.int64)
        self.col: dict[str, Array] = {n: np.zeros(0, dt) for n, (dt, _) in self._fill.items()}

    def __len__(self) -> int:
        return int(self.ids.size)

    def lookup(self, ids: npt.NDArray[np.int64]) -> tuple[Rows, npt.NDArray[np.bool_]]:
        """Rows of `ids` (adding the unknown ones) and which of them were just added."""
        pos = np.searchsorted(self.ids, ids)
        known = self.ids[np.minimum(pos, self.ids.size - 1)] == ids if self.ids.size else None
        if known is not None and bool(known.all()):
            return pos, np.zeros(ids.size, bool)
        fresh = np.unique(ids if known is None else ids[~known])
        self._add(fresh)
        return np.searchsorted(self.ids, ids), np.isin(ids, fresh)

    def forget(self, drop: npt.NDArray[np.bool_]) -> None:
        """Remove the rows where `drop` is True."""
        keep = ~drop
        self.ids = self.ids[keep]
        self.col = {name: arr[keep] for name, arr in self.col.items()}

    def _add(self, fresh: npt.NDArray[np.int64]) -> None:
        ids = np.concatenate([self.ids, fresh])
        order = np.argsort(ids, kind="stable")
        self.ids = ids[order]
        for name, arr in self.col.items():
            dtype, value = self._fill[name]
            self.col[name] = np.concatenate([arr, np.full(fresh.size, value, dtype)])[order]
