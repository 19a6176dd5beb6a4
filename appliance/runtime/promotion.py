"""Promoting a shadow: the gates it must pass (appliance/runtime/kept.py keeps the
workflow it replaced for a rollback; appliance/runtime/shadows.py does the switching).
The config imports it (a shadow declares its gates): it imports no config."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field

from appliance.watch.ranktest import MIN_SAMPLES
from appliance.watch.rule import SLOWER, Gate, Samples, compare_row, describe


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
