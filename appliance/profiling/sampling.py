"""Which batches of a profiling window run on the profiled twin of their model's session.

ORT's profiler makes every run it records about 1.5 times as long (docs/profiling.md) and
keeps each in memory until the profile ends, so a window samples: its first batch, then
every Nth, at most `max_runs` per model. One `SampledSessions` per model and window, set on
the model's batcher for the window (`ModelBatcher.choose_sessions`) and taken off at its
end.
"""

from __future__ import annotations

import onnxruntime as ort

NO_LIMIT = 1 << 31  # runs: as many as the window has


class SampledSessions:
    """A `SessionChooser` (appliance/models/batches.py): the first batch, then every
    `every_n`th, on `session`, `max_runs` of them at most; the others on the model's own.

    The batcher calls `session_for_batch` under its run lock (on its thread, or on a
    stream's for an inline run), so the counts need no lock of their own."""

    __slots__ = ("_every_n", "_left", "_seen", "session")

    def __init__(
        self, session: ort.InferenceSession, every_n: int = 1, max_runs: int = NO_LIMIT
    ) -> None:
        self.session = session  # the profiled twin: its profile is read at the window's end
        self._every_n = max(1, every_n)
        self._left = max_runs  # runs it may still take (ORT keeps each in memory)
        # Batches since the window began, its sampling phase: counted from the window's
        # start, not the model's, so a short or quiet window (fewer than N batches) still
        # gets its first batch's operators.
        self._seen = 0

    def session_for_batch(self) -> ort.InferenceSession | None:
        """The profiled session for a sampled batch; None for the others."""
        if not self._left:
            return None
        seen, self._seen = self._seen, self._seen + 1
        if seen % self._every_n:
            return None
        self._left -= 1
        return self.session
