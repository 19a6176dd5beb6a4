"""A model's declared settings with the config's `tuning:` over them (appliance tune):
`ModelTuning` is one model's entry of `tuning.models`, `tuned` applies it."""

from __future__ import annotations

from typing import Annotated

from pydantic import Field

from appliance.strict import Strict
from pipelines.spec import GraphOptimization, ModelSpec


class ModelTuning(Strict):
    """One model's settings as `appliance tune` chose them; each one set wins over the
    model's own declaration (the config's `models:` or a workflow's), None leaves it."""

    max_batch_size: Annotated[int, Field(ge=1, le=256)] | None = None
    max_queue_delay_ms: Annotated[float, Field(ge=0, le=1000)] | None = None
    intra_op_threads: Annotated[int, Field(ge=0, le=256)] | None = None
    inter_op_threads: Annotated[int, Field(ge=0, le=256)] | None = None
    allow_spinning: bool | None = None
    graph_optimization: GraphOptimization | None = None


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
