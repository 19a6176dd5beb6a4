"""Promoting a shadow: the gates it must pass, and the workflow it replaced kept for a
rollback (appliance/runtime/shadows.py does the switching)."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field

from pipelines.executor import CompiledWorkflow


class PromoteRequest(BaseModel):
    """Gates a promotion must pass (none by default), judged on the comparison so far,
    and how long the workflow it replaces stays ready for a rollback."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    min_agreement: Annotated[float, Field(ge=0, le=1)] | None = None
    max_latency_ratio: Annotated[float, Field(gt=0, le=1_000)] | None = None
    # Gates are judged only on this many compared frames or more.
    min_frames: Annotated[int, Field(ge=1, le=1_000_000)] = 30
    rollback_s: Annotated[float, Field(ge=0, le=86_400)] = 300.0

    def refusals(self, comparison: dict[str, Any]) -> list[str]:
        """Each gate the comparison fails, saying by how much; [] when it passes."""
        floor, ceiling = self.min_agreement, self.max_latency_ratio
        frames = comparison["frames"]
        if (floor is not None or ceiling is not None) and frames < self.min_frames:
            return [f"min_frames: {frames} frames compared, the gates need {self.min_frames}"]
        out: list[str] = []
        agreement = comparison["agreement"]
        if floor is not None and agreement < floor:
            short = floor - agreement
            out.append(f"min_agreement: agreement {agreement:.3f} is {short:.3f} under {floor:g}")
        ratio = comparison["latency_ms"]["ratio_p50"]
        if ceiling is not None and ratio is not None and ratio > ceiling:
            over = ratio - ceiling
            out.append(f"max_latency_ratio: ratio {ratio:.3f} is {over:.3f} over {ceiling:g}")
        return out


@dataclass(frozen=True, slots=True)
class Previous:
    """The workflow a promotion replaced, leased until `until` (time.monotonic())."""

    workflow: CompiledWorkflow
    promoted: str  # the version that replaced it
    until: float
    unhook: Callable[[], None]  # removes the stream's hook that lets it go with the stream

    @property
    def expired(self) -> bool:
        return time.monotonic() >= self.until
