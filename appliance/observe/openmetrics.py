"""prometheus_client's OpenMetrics exposition and parser, typed: the library leaves both
untyped, and mypy (strict) refuses untyped calls."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, cast

from prometheus_client.metrics_core import Metric
from prometheus_client.openmetrics import exposition, parser

CONTENT_TYPE: str = exposition.CONTENT_TYPE_LATEST


def render(registry: Any) -> bytes:
    """The registry's families in OpenMetrics, exemplars included (`# EOF` last)."""
    return cast(bytes, exposition.generate_latest(registry))  # type: ignore[no-untyped-call]


def families(text: str) -> Iterator[Metric]:
    """The families of an OpenMetrics text, with their samples' exemplars;
    ValueError when it is not OpenMetrics."""
    return cast(Iterator[Metric], parser.text_string_to_metric_families(text))  # type: ignore[no-untyped-call]
