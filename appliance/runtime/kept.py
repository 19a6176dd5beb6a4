"""The workflow a promotion replaced, kept for its rollback window (by hand, or by the
regression watch: appliance/runtime/shadows.py)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from appliance.config import StreamConfig
from pipelines.executor import CompiledWorkflow


@dataclass(frozen=True, slots=True)
class Previous:
    """The workflow a promotion replaced, leased until `until` (time.monotonic())."""

    workflow: CompiledWorkflow
    promoted: str  # the version that replaced it
    until: float
    unhook: Callable[[], None]  # removes the stream's hook that lets it go with the stream
    declared: StreamConfig  # the stream as it was declared before: a rollback's again
    auto: bool = True  # a regression within the window rolls back by itself

    @property
    def expired(self) -> bool:
        return time.monotonic() >= self.until


class Kept:
    """Stream id -> the workflow its last promotion replaced, until its window ends.
    Expired ones are released at the next keep; `release` gives a workflow's lease back."""

    def __init__(self, release: Callable[[CompiledWorkflow], None]) -> None:
        self._release = release
        self._kept: dict[str, Previous] = {}
        self._lock = threading.Lock()

    def keep(self, stream_id: str, previous: Previous) -> None:
        """Keep `previous` for the stream (at once released when its window is 0); the
        stream's earlier one and every expired one go now."""
        with self._lock:
            ended = [k for k, p in self._kept.items() if p.expired or k == stream_id]
            gone = [self._kept.pop(k) for k in ended]
            if previous.expired:
                gone.append(previous)
            else:
                self._kept[stream_id] = previous
        for each in gone:
            each.unhook()
            self._release(each.workflow)

    def take(self, stream_id: str) -> Previous | None:
        """The stream's kept workflow, no longer kept (its stop hook removed); None when
        there is none or its window ended (then released)."""
        with self._lock:
            kept = self._kept.pop(stream_id, None)
        if kept is None:
            return None
        kept.unhook()
        if kept.expired:
            self._release(kept.workflow)
            return None
        return kept

    def peek(self, stream_id: str, auto: bool = False) -> Previous | None:
        """The stream's kept workflow while its window runs (and, with `auto`, only if
        it rolls back by itself), still kept."""
        with self._lock:
            kept = self._kept.get(stream_id)
        ready = kept is not None and not kept.expired and (kept.auto or not auto)
        return kept if ready else None

    def forget(self, stream_id: str, promoted: str) -> None:
        """The promoted stream stopped: the workflow kept for its rollback goes (not a
        later promotion's)."""
        with self._lock:
            kept = self._kept.get(stream_id)
            if kept is None or kept.promoted != promoted:
                return
            del self._kept[stream_id]
        self._release(kept.workflow)
