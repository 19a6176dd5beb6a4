"""Promoting a shadow: the gates it must pass, and the workflow it replaced kept for a
rollback, by hand or by the regression watch (appliance/runtime/shadows.py does the
switching)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated, Any

from pydantic import BaseModel, ConfigDict, Field

from appliance.watch.ranktest import MIN_SAMPLES
from appliance.watch.rule import SLOWER, Gate, Samples, compare_row, describe
from pipelines.executor import CompiledWorkflow

if TYPE_CHECKING:  # the config holds a shadow's gates: imported only for the type
    from appliance.config import StreamConfig


class PromoteRequest(BaseModel):
    """Gates a promotion must pass (none by default), judged on the comparison so far,
    and how long the workflow it replaces stays ready for a rollback."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    min_agreement: Annotated[float, Field(ge=0, le=1)] | None = None
    max_latency_ratio: Annotated[float, Field(gt=0, le=1_000)] | None = None
    # Gates are judged only on this many compared frames or more.
    min_frames: Annotated[int, Field(ge=1, le=1_000_000)] = 30
    rollback_s: Annotated[float, Field(ge=0, le=86_400)] = 300.0
    # Within rollback_s, a regression the watch raises on the stream (one of its blocks,
    # its frame or frame age, a model it runs) switches it back by itself.
    auto_rollback: bool = True

    def refusals(
        self, comparison: dict[str, Any], latency_ms: Sequence[tuple[float, float]] = ()
    ) -> list[str]:
        """Each gate the comparison fails, saying by how much; [] when it passes.
        `latency_ms`: each compared frame's (live, candidate) run time, for the latency
        gate (trace diff's rule; without them, the median ratio alone)."""
        floor, ceiling = self.min_agreement, self.max_latency_ratio
        frames = comparison["frames"]
        if (floor is not None or ceiling is not None) and frames < self.min_frames:
            return [f"min_frames: {frames} frames compared, the gates need {self.min_frames}"]
        out: list[str] = []
        agreement = comparison["agreement"]
        if floor is not None and agreement < floor:
            short = floor - agreement
            out.append(f"min_agreement: agreement {agreement:.3f} is {short:.3f} under {floor:g}")
        if ceiling is not None:
            refusal = latency_refusal(ceiling, comparison["latency_ms"]["ratio_p50"], latency_ms)
            out += [refusal] if refusal else []
        return out


def merged(declared: PromoteRequest | None, request: PromoteRequest) -> PromoteRequest:
    """The gates a promotion is judged by: the shadow's declared ones (`promote:`), with
    what the request sets over them."""
    if declared is None:
        return request
    return declared.model_copy(update={k: getattr(request, k) for k in request.model_fields_set})


def latency_refusal(
    ceiling: float, ratio: float | None, pairs: Sequence[tuple[float, float]]
) -> str | None:
    """Why the candidate's run time fails `max_latency_ratio`, or None. With enough
    frames and a ceiling of 1 or more, by `trace diff`'s rule (appliance/watch/rule.py):
    slower than the live run by more than the ceiling allows, materially and
    significantly, so that a ratio just over it by the machine's noise is not refused."""
    if ceiling >= 1 and len(pairs) >= MIN_SAMPLES:
        before, after = Samples(), Samples()
        before.rows[ROW] = [round(live * 1000) for live, _ in pairs]  # µs, as traces have them
        after.rows[ROW] = [round(candidate * 1000) for _, candidate in pairs]
        row = compare_row(*ROW, before, after, Gate(fail_over_pct=(ceiling - 1) * 100))
        if row.verdict != SLOWER:
            return None
        return (
            f"max_latency_ratio: the candidate's run is {row.after_ms / row.before_ms:.3f}x "
            f"the live one's, over {ceiling:g} by trace diff's rule ({describe(row, GATE)})"
        )
    if ratio is not None and ratio > ceiling:
        return f"max_latency_ratio: ratio {ratio:.3f} is {ratio - ceiling:.3f} over {ceiling:g}"
    return None


ROW = ("frame", "candidate")  # the rule's row: a frame's whole workflow run
GATE = Gate()  # trace diff's defaults: what `describe` prints the confidence of


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
