"""OpenMetrics exemplars on the latency histograms: each bucket names a recent frame that
landed in it, so a point on a latency panel leads to that frame's trace
(`GET /v1/streams/{id}/frames/{seq}/trace`, docs/exemplars.md).

prometheus_client keeps one exemplar per bucket, the last one given. Handing it one with
every observation would cost a dict, a string and its checks per block per frame, so an
observation carries one only when its bucket's exemplar is older than REFRESH_S: a
bisect and a float compare otherwise (bench/exemplars.py measures the difference). A
rare bucket, the slow tail a spike is made of, gets every frame that lands in it, as
long as those come less often than once per REFRESH_S.

Labels, in order of need, as many as fit OpenMetrics' 128 characters (names and values
together; prometheus_client raises past them): `trace_id` (`<stream>/frames/<seq>`: the
one label Grafana's exemplar link can read, `${__value.raw}`), `stream`, `seq`, `trace`
(the rolling trace file that will hold the frame) and `window` (a profiling window
running meanwhile: its trace has ORT's operators).
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable, Sequence
from typing import Protocol

REFRESH_S = 1.0  # a bucket's exemplar is at most this old while frames land in it
MAX_CHARS = 128  # OpenMetrics: an exemplar's label names and values, together


class Observer(Protocol):
    """A prometheus_client histogram child."""

    def observe(self, amount: float, exemplar: dict[str, str] | None = None) -> None: ...


class FrameTags:
    """What an exemplar says of a frame besides its stream and seq: the rolling trace
    file being written and the profiling window running, each read only when an
    exemplar is made (both callables answer None when there is none)."""

    def __init__(
        self,
        trace_file: Callable[[], str | None] = lambda: None,
        window: Callable[[], str | None] = lambda: None,
    ) -> None:
        self.trace_file = trace_file
        self.window = window
        # Each stream's frame in work, set by its worker when it takes one: a model's
        # batch names the frame its first sample came from (a dict store a frame).
        self.working: dict[str, int] = {}

    def labels(self, stream: str, seq: int) -> dict[str, str]:
        """The exemplar's labels for frame `seq` of `stream`, within MAX_CHARS."""
        wanted = (
            ("trace_id", f"{stream}/frames/{seq}"),
            ("stream", stream),
            ("seq", str(seq)),
            ("trace", self.trace_file()),
            ("window", self.window()),
        )
        out: dict[str, str] = {}
        used = 0
        for name, value in wanted:
            if value is None:
                continue
            size = len(name) + len(value)
            if used + size <= MAX_CHARS:
                out[name] = value
                used += size
        return out


class Sampled:
    """One histogram child whose buckets each hold a recent exemplar."""

    __slots__ = ("_bounds", "_child", "_due", "_observe")

    def __init__(self, child: Observer, bounds: Sequence[float]) -> None:
        self._child = child
        self._observe = child.observe
        self._bounds = tuple(bounds)  # the finite upper bounds; past the last: +Inf
        self._due = [0.0] * (len(self._bounds) + 1)  # perf_counter s a bucket takes a new one

    def observe(self, amount: float, now: float, tags: FrameTags, stream: str, seq: int) -> None:
        """Observe `amount` at `now` (perf_counter s); with an exemplar of frame `seq` of
        `stream` when its bucket's is due (seq < 0: no frame known, none)."""
        i = bisect_left(self._bounds, amount)  # the first bound >= amount: Prometheus' `le`
        due = self._due
        if now < due[i] or seq < 0:
            self._observe(amount)
            return
        due[i] = now + REFRESH_S
        self._observe(amount, tags.labels(stream, seq))


def upper_bounds(histogram: object) -> tuple[float, ...]:
    """A prometheus_client histogram's finite bucket bounds (its `_upper_bounds` ends with
    +Inf); the parent's, which every child shares."""
    bounds: Sequence[float] = getattr(histogram, "_upper_bounds")  # noqa: B009
    return tuple(b for b in bounds if b != float("inf"))
