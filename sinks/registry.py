"""Sink type name -> import string, imported only when a config uses the type (uvicorn's
importer practice, through the same helper as the block and decoder registries).

Each sink class carries its config model as `Config` (a pydantic model with a
`type: Literal[<name>]` field), so a config's `sinks:` entries are validated by the
type they name, with every problem located.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel

from pipelines.importer import ImportFromStringError, import_from_string

SINKS: Mapping[str, str] = {
    "mqtt": "sinks.mqtt.sink:MqttSink",
    "webhook": "sinks.webhook.sink:WebhookSink",
}


class SinkTypeError(LookupError):
    """An unknown sink type, or one whose module cannot be imported."""


def sink_class(kind: str) -> Any:
    """The sink class registered as `kind`; SinkTypeError naming the known types."""
    target = SINKS.get(kind)
    if target is None:
        raise SinkTypeError(f"unknown sink type {kind!r} (known: {', '.join(sorted(SINKS))})")
    try:
        return import_from_string(target)
    except ImportFromStringError as exc:
        raise SinkTypeError(f"sink type {kind!r}: {exc}") from exc


def config_model(kind: str) -> type[BaseModel]:
    """The pydantic model that validates a sink of type `kind`."""
    model: type[BaseModel] = sink_class(kind).Config
    return model
