"""The config's `profiling:` section: continuous profiling (docs/profiling.md), with the
regression watch's settings inside it (`profiling.watch`, appliance/watch/config.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

from pydantic import Field

from appliance.strict import Strict
from appliance.watch.config import WatchConfig


class ProfilingConfig(Strict):
    """Continuous profiling: rolling Chrome traces and latency histograms."""

    enabled: bool = True
    dir: Path = Path("traces")  # relative to the config file; rolling/ goes inside
    rotate_s: Annotated[float, Field(gt=0)] = 60.0
    keep_files: Annotated[int, Field(ge=1)] = 60
    keep_bytes: Annotated[int, Field(ge=1)] = 500 * 1024 * 1024
    gzip: bool = False
    sample_every_n_frames: Annotated[int, Field(ge=1)] = 1
    max_window_s: Annotated[float, Field(gt=0)] = 300.0  # longest on-demand window
    # A window's ONNX Runtime operator profile records one model batch in N, and at most
    # M per model: ORT keeps a recorded run's events in memory (about 0.5 MB of JSON for
    # the person detector's 524 operators) until the window ends, and stops recording at
    # a million events.
    ort_sample_every_n_batches: Annotated[int, Field(ge=1)] = 16
    ort_max_runs_per_window: Annotated[int, Field(ge=1, le=1000)] = 100
    buckets: list[Annotated[float, Field(gt=0)]] | None = None  # histogram bounds, seconds
    # OpenMetrics exemplars on the latency histograms: each bucket names a recent frame
    # that landed in it, and its trace (docs/exemplars.md; cost: bench/exemplars.py).
    exemplars: bool = True
    watch: WatchConfig = WatchConfig()
