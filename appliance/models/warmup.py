"""Warm-up at load: each batch size a model will see, run once before the first frame."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from appliance.models.session import LoadedModel
    from pipelines.spec import ModelSpec


def warm_up(model: LoadedModel, spec: ModelSpec) -> None:
    """Run the model once per batch size up to `spec.batching.max_batch_size`."""
