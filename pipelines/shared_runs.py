"""A model's run on one frame's image, shared by the workflows that ask for it.

A stream's shadow (appliance/runtime/shadow.py) runs a candidate workflow on the very
frames the live workflow runs. When both run the same model (one handle: the same
declaration) on the same image of the same frame, the second asks for what the first
computes instead of preprocessing and running the model again: a shadow that changes
only what follows the model (a threshold, a tracker, a counter) then costs its own
blocks and not the model's run. The runtime turns it on while a shadow runs on the
model, and off after (`enabled`); off, a detect block pays one attribute read a frame.

The key is the stream, the frame's sequence number and capture time, and the identity
of the image array: two blocks share only when they read the same array (the frame
itself, which both workflows hold read-only), never a crop or a drawing made from it.
The outputs are shared read-only (marked so): a decoder writes into its own arrays.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable, Sequence
from concurrent.futures import Future
from typing import Any

import numpy as np

from pipelines.models import Tensor

KEPT = 4  # runs kept: the shadow takes the newest frame the live worker offered it

Run = tuple[Sequence[Tensor], Any]  # the model's outputs, and the preprocessing's transform


class SharedRuns:
    """One model's recent runs by frame image; `enabled` by the runtime (any thread)."""

    def __init__(self, kept: int = KEPT) -> None:
        self.enabled = False
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

    def clear(self) -> None:
        with self._lock:
            self._runs.clear()
