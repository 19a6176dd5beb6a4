"""Sink type name -> import string, imported only when a config uses the type (uvicorn's
importer practice, through the same helper as the block and decoder registries).

Each sink class is a `sinks.base.SinkKind`: it carries its config model as `Config` (a
pydantic model with a `type: Literal[<name>]` field), so a config's `sinks:` entries are
validated by the type they name, with every problem located, and `build` makes a sink from
that config and the runtime's `SinkContext`. Adding a kind: its package under sinks/, its
class implementing `Sink` and `SinkKind`, and one line here.
"""

from __future__ import annotations

from collections.abc import Mapping

from pydantic import BaseModel

from pipelines.importer import ImportFromStringError, import_from_string
from sinks.base import SinkKind

SINKS: Mapping[str, str] = {
    "mqtt": "sinks.mqtt.sink:MqttSink",
    "webhook": "sinks.webhook.sink:WebhookSink",
}


class SinkTypeError(LookupError):
    """An unknown sink type, or one whose module cannot be imported."""


def sink_class(kind: str) -> SinkKind:
    """The sink class registered as `kind`; SinkTypeError naming the known types."""
    target = SINKS.get(kind)
    if target is None:
        raise SinkTypeError(f"unknown sink type {kind!r} (known: {', '.join(sorted(SINKS))})")
    try:
        cls: SinkKind = import_from_string(target)
    except ImportFromStringError as exc:
        raise SinkTypeError(f"sink type {kind!r}: {exc}") from exc
    return cls


def config_model(kind: str) -> type[BaseModel]:
    """The pydantic model that validates a sink of type `kind`."""
    return sink_class(kind).Config
