"""The search space: each knob the tuner may turn, with the values it tries, bounded by
what this machine has (its cores, the providers that really load) and by what the
workload runs (its models, whether any camera is RTSP).

A knob's key names where it goes in the config's `tuning:` section: `<model>.<setting>`
for a model (appliance/models/tuned.py ModelTuning), `sources.<setting>` for every stream's
source (SourceTuning). Settings are knob key -> value.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any

import yaml

from appliance.config import TuningConfig
from pipelines.spec import ModelSpec

Settings = dict[str, Any]  # knob key -> value
SOURCES = "sources"

# Values tried per model knob. Batch sizes: powers of two up to 8 on a CPU (a batch of
# more frames than cores gains nothing there, and waits longer for company); a GPU gets
# 16 and 32 too. Queue delays in ms: 0 (whatever waits) up to 10 (2/3 of a 15 fps frame
# interval is 44 ms; waiting longer than a few ms only adds age once every stream
# submits at once, batcher.py). Graph optimisation: "disable" is never faster.
BATCH_SIZES = (1, 2, 4, 8)
GPU_BATCH_SIZES = (16, 32)
QUEUE_DELAYS_MS = (0.0, 2.0, 5.0, 10.0)
GRAPH_LEVELS = ("basic", "all")
# ORT's inter-op pool runs only in its parallel execution mode, which the appliance does
# not enable (sessions run their graph sequentially): inter_op_threads changes nothing,
# so it is not searched.
MODEL_KNOBS = (
    "max_batch_size",
    "max_queue_delay_ms",
    "intra_op_threads",
    "allow_spinning",
    "graph_optimization",
)
SOURCE_KNOBS = ("reader", "decoder_threads")
SETTINGS = (*MODEL_KNOBS, *SOURCE_KNOBS)  # every setting a knob may turn


@dataclass(frozen=True)
class Hardware:
    """What bounds the space: usable cores, and whether a GPU provider really loads."""

    cores: int
    gpu: bool = False

    @classmethod
    def here(cls) -> Hardware:
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None
        from appliance.models.session import provider_problem  # loads ORT: only when asked

        return cls(cores=cores or os.cpu_count() or 1, gpu=provider_problem("cuda") is None)


@dataclass(frozen=True)
class Knob:
    """One setting the tuner turns: where it goes, the values it tries, the one in effect
    when the tune started, and whether applying it restarts the streams."""

    key: str
    scope: str  # a model id, or SOURCES
    name: str  # the field of ModelTuning or SourceTuning
    values: tuple[Any, ...]
    start: Any
    restarts: bool = False

    def others(self, current: Any) -> list[Any]:
        """The values to try against `current`, nearest first (for a number)."""
        rest = [v for v in self.values if v != current]
        if all(isinstance(v, int | float) and not isinstance(v, bool) for v in rest):
            rest.sort(key=lambda v: abs(v - current))
        return rest


def thread_counts(cores: int) -> tuple[int, ...]:
    """1 .. cores on a small machine; on a larger one 1, 2, a quarter, half and all."""
    if cores <= 4:
        return tuple(range(1, cores + 1))
    return tuple(sorted({1, 2, max(1, cores // 4), cores // 2, cores}))


def model_knobs(
    model_id: str, spec: ModelSpec, hardware: Hardware, fixed_batch: int | None
) -> list[Knob]:
    """A model's knobs; `spec` is what runs now (its tuning applied), `fixed_batch` the
    batch size the model's input fixes (then batch size is not searched)."""
    batching, session = spec.batching, spec.session
    intra_now = session.intra_op_threads or hardware.cores  # 0: ORT's one per core
    values: dict[str, tuple[Any, ...]] = {
        "max_batch_size": () if fixed_batch else BATCH_SIZES + (GPU_BATCH_SIZES * hardware.gpu),
        "max_queue_delay_ms": QUEUE_DELAYS_MS,
        # On a GPU the CPU threads only feed it; what they are set to barely matters.
        "intra_op_threads": () if hardware.gpu else thread_counts(hardware.cores),
        "allow_spinning": (True, False),
        "graph_optimization": GRAPH_LEVELS,
    }
    start: dict[str, Any] = {
        "max_batch_size": batching.max_batch_size,
        "max_queue_delay_ms": float(batching.max_queue_delay_ms),
        "intra_op_threads": intra_now,
        "allow_spinning": session.allow_spinning,
        "graph_optimization": session.graph_optimization,
    }
    return [
        Knob(f"{model_id}.{name}", model_id, name, _with(values[name], start[name]), start[name])
        for name in MODEL_KNOBS
        if len(values[name]) > 1
    ]


def source_knobs(rtsp: bool, start: Mapping[str, Any], hardware: Hardware) -> list[Knob]:
    """The sources' knobs: the RTSP reader where a camera is RTSP, the decoder's threads
    (0: FFmpeg's choice). Both restart the streams when they change."""
    knobs = []
    if rtsp:
        reader = start.get("reader") or "auto"
        knobs.append(Knob("sources.reader", SOURCES, "reader", ("auto", "ffmpeg"), reader, True))
    threads = start.get("decoder_threads") or 0
    values = _with((0, 1, *((2,) if hardware.cores > 2 else ())), threads)
    knobs.append(Knob("sources.decoder_threads", SOURCES, "decoder_threads", values, threads, True))
    return knobs


def restrict(
    knobs: Iterable[Knob], only: Mapping[str, tuple[Any, ...] | None] | None
) -> list[Knob]:
    """The knobs whose key or setting name is in `only` (None: every knob), with the
    values `only` gives it, if any (the one in effect stays among them)."""
    if only is None:
        return list(knobs)
    kept = []
    for knob in knobs:
        name = knob.key if knob.key in only else knob.name if knob.name in only else None
        if name is None:
            continue
        values = only[name]
        kept.append(knob if values is None else replace(knob, values=_with(values, knob.start)))
    return kept


def parse_knob(text: str, where: str = "--knob") -> tuple[str, tuple[Any, ...] | None]:
    """`max_batch_size=1,2,4` or `faces.allow_spinning` (its own values): the name and
    the values, each parsed as YAML (`true`, `2`, `2.5`, `all`). ValueError naming it."""
    name, _, values = text.partition("=")
    if name.rsplit(".", 1)[-1] not in SETTINGS:
        raise ValueError(f"{where}: unknown knob {name!r} (known: {', '.join(SETTINGS)})")
    if not values:
        return name, None
    parsed = tuple(yaml.safe_load(v) for v in values.split(","))
    if any(v is None or isinstance(v, dict | list) for v in parsed):
        raise ValueError(f"{where}: {text!r}: values are numbers, true/false or names")
    return name, parsed


def start_settings(knobs: Iterable[Knob]) -> Settings:
    return {k.key: k.start for k in knobs}


def to_tuning(
    base: TuningConfig, settings: Mapping[str, Any], knobs: Iterable[Knob]
) -> TuningConfig:
    """`base` (the config's own `tuning:`) with `settings` over it."""
    models: dict[str, dict[str, Any]] = {
        m: t.model_dump(exclude_none=True) for m, t in base.models.items()
    }
    sources = base.sources.model_dump(exclude_none=True)
    for knob in knobs:
        if knob.key not in settings:
            continue
        target = sources if knob.scope == SOURCES else models.setdefault(knob.scope, {})
        target[knob.name] = settings[knob.key]
    return TuningConfig.model_validate({"models": models, "sources": sources})


def _with(values: tuple[Any, ...], start: Any) -> tuple[Any, ...]:
    """The values, with the one in effect now among them (a user's own stays a candidate)."""
    return values if start in values else (*values, start)
