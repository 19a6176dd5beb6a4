"""A model's run on one frame's image, shared by the workflows that ask for it.

A stream's shadow (appliance/runtime/shadow.py) runs a candidate workflow on the very
frames the live workflow runs. When both run the same model (one handle: the same
declaration) on the same image of the same frame, the second asks for what the first
computes instead of preprocessing and running the model again: a shadow that changes
only what follows the model (a threshold, a tracker, a counter) then costs its own
blocks and not the model's run. The runtime turns it on for a stream while a shadow
runs on it with the model, and off after (`streams`): a detect block pays one set lookup
a frame, and the other streams on the model go on as if it were not there.

The key is the stream, the frame's sequence number and capture time, and the identity
of the image array: two blocks share only when they read the same array (the frame
itself, which both workflows hold read-only), never a crop or a drawing made from it.
The outputs are shared read-only (marked so): a decoder writes into its own arrays.
"""

from __future__ import annotations

import threading
from collections import Counter, OrderedDict
from collections.abc import Callable, Hashable, Sequence
from concurrent.futures import Future
from typing import Any

import numpy as np

from pipelines.models import Tensor

KEPT = 4  # runs kept, of the shadowed streams: a shadow takes the newest frame offered it

Run = tuple[Sequence[Tensor], Any]  # the model's outputs, and the preprocessing's transform


class SharedRuns:
    """One model's recent runs by frame image, for the streams it is on for (`share`,
    from any thread; `streams` is replaced whole, so a reader needs no lock)."""

    def __init__(self, kept: int = KEPT) -> None:
        self.streams: frozenset[str] = frozenset()
        self._shadows: Counter[str] = Counter()  # shadows per stream on this model
        self._kept = kept
        self._runs: OrderedDict[Hashable, Future[Run]] = OrderedDict()
        self._lock = threading.Lock()
        self.shared = 0  # runs another block took from here instead of running the model

    def run(self, key: Hashable, compute: Callable[[], Run], timeout: float) -> Run:
        """The run of `key`: computed here (`compute`), or waited for when another
        workflow computes it or did."""
        with self._lock:
            pending = self._runs.get(key)
            if pending is None:
                mine: Future[Run] = Future()
                self._runs[key] = mine
                while len(self._runs) > self._kept:
                    self._runs.popitem(last=False)
            else:
                self.shared += 1
        if pending is not None:
            return pending.result(timeout)
        try:
            outputs, transform = compute()
            for tensor in outputs:
                if isinstance(tensor, np.ndarray):
                    tensor.flags.writeable = False  # shared: nobody writes into it
        except BaseException as exc:
            mine.set_exception(exc)
            raise
        mine.set_result((outputs, transform))
        return outputs, transform

    @property
    def enabled(self) -> bool:
        """Whether any stream shares this model's runs now."""
        return bool(self.streams)

    def share(self, stream_id: str, delta: int) -> None:
        """A shadow on `stream_id` started (+1) or ended (-1) with this model; with none
        left, the runs kept go."""
        with self._lock:
            self._shadows[stream_id] += delta
            self._shadows = +self._shadows  # only the positive counts stay
            self.streams = frozenset(self._shadows)
            if not self.streams:
                self._runs.clear()
