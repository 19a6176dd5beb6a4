"""A model's declared settings with the config's `tuning:` over them (appliance tune)."""

from __future__ import annotations

from appliance.sections import ModelTuning
from pipelines.spec import ModelSpec


def tuned(spec: ModelSpec, tuning: ModelTuning | None) -> ModelSpec:
    """`spec` with the tuning's settings over its own (the config's `tuning.models.<id>`)."""
    if tuning is None:
        return spec
    batching = {k: v for k, v in tuning if v is not None and k in BATCHING_KNOBS}
    session = {k: v for k, v in tuning if v is not None and k not in BATCHING_KNOBS}
    return spec.model_copy(
        update={
            "batching": spec.batching.model_copy(update=batching),
            "session": spec.session.model_copy(update=session),
        }
    )


BATCHING_KNOBS = frozenset({"max_batch_size", "max_queue_delay_ms"})


def describe_tuning(declared: ModelSpec, spec: ModelSpec) -> str:
    pairs = [*spec.batching, *spec.session]
    before = dict([*declared.batching, *declared.session])
    return ", ".join(f"{k}={v}" for k, v in pairs if before[k] != v) or "as declared"
