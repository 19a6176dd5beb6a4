"""The config's `profiling.watch:` section: the regression watch (docs/profiling.md,
"Regression watch")."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

from pydantic import Field

from appliance.strict import Strict


class WatchConfig(Strict):
    """The regression watch (docs/profiling.md, "Regression watch"): each stream's block,
    model and frame-age latencies against a baseline, with `trace diff`'s rule."""

    enabled: bool = True
    interval_s: Annotated[float, Field(ge=1, le=3600)] = 30.0  # one comparison per interval
    # After a stream (re)starts or a model loads: skipped (ONNX Runtime's first runs,
    # caches filling), neither learned nor compared.
    warmup_s: Annotated[float, Field(ge=0, le=3600)] = 20.0
    learn_s: Annotated[float, Field(gt=0, le=86400)] = 180.0  # a new row's baseline
    reservoir: Annotated[int, Field(ge=100, le=20000)] = 1000  # samples a baseline keeps
    # Recent samples compared per row and interval (a uniform sample when more came).
    window_samples: Annotated[int, Field(ge=50, le=20000)] = 1000
    # trace diff's gate (appliance/watch/rule.py), with its CLI's names. 25 %: on cores
    # the streams saturate, their models' run times drift over minutes with nothing
    # changed (their runs overlap more or less); 10 % raised false regressions within
    # minutes on the demo here (docs/profiling.md, "Regression watch").
    fail_over_pct: Annotated[float, Field(ge=0, le=1000)] = 25.0
    min_ms: Annotated[float, Field(ge=0)] = 0.2
    min_frame_pct: Annotated[float, Field(ge=0, le=100)] = 1.0
    confidence: Annotated[float, Field(gt=0.5, lt=1)] = 0.999
    # The host is slower when its speed probe and the shift every row shares agree on
    # more than this (%); blocks are then judged on what that shift does not explain.
    host_pct: Annotated[float, Field(gt=0, le=1000)] = 10.0
    # After a change of the appliance's own load (a stream added, removed or restarted, a
    # reload, a tune applied), rows slower only by waiting are that change's; once this
    # long has passed, their baselines follow the new load (docs/profiling.md).
    settle_s: Annotated[float, Field(ge=0, le=3600)] = 60.0
    confirm_intervals: Annotated[int, Field(ge=1, le=100)] = 1  # slower in a row to raise
    recover_intervals: Annotated[int, Field(ge=1, le=100)] = 2  # not slower in a row to end
    # The evidence: a profiling window the watch opens itself on a regression, at most
    # once per stream per cooldown_s.
    evidence_s: Annotated[float, Field(gt=0, le=300)] = 10.0
    cooldown_s: Annotated[float, Field(ge=0)] = 600.0
    # A baseline made by `appliance trace fingerprint` (CI's, shared by a fleet); through
    # the file-access policy, relative to the config file. None: learned here.
    baseline: Path | None = None
    # Rows never raised, as the API names them: "cam1/blur", "model:faces".
    mute: Annotated[list[Annotated[str, Field(max_length=256)]], Field(max_length=1024)] = Field(
        default_factory=list
    )
