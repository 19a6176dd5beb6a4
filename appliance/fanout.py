"""Hands each FrameResult to every subscriber: in-process callbacks now, sinks later.

Subscribers run on the publishing worker thread, so they must be quick (a sink puts the
result on its own bounded queue). One subscriber's exception is logged and never stops
the others or the stream.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from pipelines.types import FrameResult

log = logging.getLogger("appliance.fanout")

Subscriber = Callable[[FrameResult], None]


class Fanout:
    """Copy-on-write subscriber list: publishing takes no lock."""

    def __init__(self) -> None:
        self._subscribers: tuple[Subscriber, ...] = ()
        self._lock = threading.Lock()

    def subscribe(self, fn: Subscriber) -> Callable[[], None]:
        """Add a subscriber; returns the function that removes it."""
        with self._lock:
            self._subscribers = (*self._subscribers, fn)

        def unsubscribe() -> None:
            with self._lock:
                self._subscribers = tuple(s for s in self._subscribers if s is not fn)

        return unsubscribe

    def publish(self, result: FrameResult) -> None:
        for fn in self._subscribers:
            try:
                fn(result)
            except Exception:  # a broken subscriber must not take down the stream
                log.exception("subscriber %r failed on %s#%d", fn, result.stream_id, result.seq)
