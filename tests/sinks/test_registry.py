"""The sink registry's contract: every kind is validated by its own model and built the
same way, `build(name, config, SinkContext)`, with what that kind takes from the context;
and `SinkState` spells the states as the API, `/ready` and the logs always have."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, get_args

import pytest
from pydantic import BaseModel

from sinks.base import SinkContext, SinkState
from sinks.mqtt.config import MqttConfig
from sinks.registry import SINKS, config_model, sink_class
from sinks.webhook.http import WebhookConfig

MINIMAL: dict[str, dict[str, Any]] = {
    "mqtt": {"type": "mqtt", "host": "127.0.0.1", "client_id": "appliance-test"},
    "webhook": {"type": "webhook", "url": "http://127.0.0.1:9/hook"},
}


def built(kind: str, tmp_path: Path, **context: Any) -> Any:
    config = config_model(kind).model_validate(MINIMAL[kind])
    return sink_class(kind).build("out", config, SinkContext(data_dir=tmp_path, **context))


def test_every_kind_has_a_minimal_config_here() -> None:
    assert set(MINIMAL) == set(SINKS)


@pytest.mark.parametrize("kind", sorted(SINKS))
def test_every_kind_is_validated_by_its_own_model_and_built_alike(
    kind: str, tmp_path: Path
) -> None:
    model = config_model(kind)
    assert issubclass(model, BaseModel)
    assert get_args(model.model_fields["type"].annotation) == (kind,)
    status = built(kind, tmp_path).status()  # built, not started: nothing connects
    assert (status.name, status.type, status.state, status.up) == (
        "out",
        kind,
        SinkState.STARTING,
        False,
    )


@pytest.mark.parametrize("kind", sorted(SINKS))
def test_a_kind_refuses_another_kinds_config(kind: str, tmp_path: Path) -> None:
    other = next(k for k in sorted(SINKS) if k != kind)
    config = config_model(other).model_validate(MINIMAL[other])
    with pytest.raises(TypeError, match=type(config).__name__):
        sink_class(kind).build("out", config, SinkContext(data_dir=tmp_path))


def test_a_webhook_keeps_its_dead_letters_below_the_data_dir(tmp_path: Path) -> None:
    status = built("webhook", tmp_path).status()
    assert status.extra["dead_letter_file"] == str(tmp_path / "dead-letters" / "out.jsonl")
    assert isinstance(built("webhook", tmp_path).config, WebhookConfig)


def test_an_mqtt_sink_takes_this_process_client_id_and_command_switch(tmp_path: Path) -> None:
    config = MqttConfig.model_validate({**MINIMAL["mqtt"], "commands": {"enabled": True}})
    one: Any = sink_class("mqtt").build("bus", config, SinkContext(data_dir=tmp_path))
    assert (one.config.client_id, one.config.commands.enabled) == ("appliance-test", True)
    worker = SinkContext(data_dir=tmp_path, client_suffix="-w2", take_commands=False)
    other: Any = sink_class("mqtt").build("bus", config, worker)
    assert (other.config.client_id, other.config.commands.enabled) == ("appliance-test-w2", False)
    assert config.client_id == "appliance-test"  # the declared config is left as it was


def test_sink_states_serialise_as_they_always_have() -> None:
    assert [s.value for s in SinkState] == [
        "starting",
        "connected",
        "reconnecting",
        "auth_failed",
        "tls_failed",
        "refused",
        "ok",
        "failing",
        "stopped",
    ]
    assert json.dumps({"bus": SinkState.AUTH_FAILED}) == '{"bus": "auth_failed"}'
    assert f"{SinkState.FAILING}" == "failing" and str(SinkState.OK) == "ok"  # logs: %s
