"""MQTT commands under `serve --workers`: one answer per command, as one process gives.

Every worker shares the config, so every worker's MQTT sink would take `<prefix>/cmd/...`:
a restart would be done by the stream's worker and refused by the others, a profiling
window opened in each. Instead worker 0 alone subscribes, and hands each command to the
gateway's API, which runs it where it belongs: a restart on the stream's worker, a
profiling window in every worker that runs a traced stream, merged under one id. The
other workers leave commands off (`Outputs(take_commands=False)`).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from appliance.client import ApplianceAPIError, ApplianceClient, ApplianceClientError
from appliance.config import AppConfig
from appliance.policy.files import FilePolicy
from appliance.runtime.commands import MQTT_ACTOR, Answer, Command, CommandClient, CommandDispatch
from appliance.server.auth import admin_token, configured_tokens
from sinks.mqtt.commands import CommandHandler


def worker_commands(
    index: int, gateway: str | None, config: AppConfig, environ: Mapping[str, str]
) -> tuple[CommandHandler | None, bool]:
    """(handler, take commands) for worker `index`: worker 0 hands them to the gateway at
    `gateway`, with the API token the gateway checks (the same config and environment);
    the others take none."""
    if index != 0 or gateway is None:
        return None, False
    token = admin_token(configured_tokens(config.server, environ, FilePolicy.owner(config)))
    return gateway_commands(gateway, token, config.limits.request_timeout_s), True


def gateway_commands(url: str, token: str | None, timeout_s: float) -> CommandDispatch:
    """A command handler that runs each command through the gateway's API at `url`
    (`unix:PATH`: the gateway's own socket, as `serve --workers` gives it), on behalf
    of `mqtt` (what the audit records)."""
    own = Path(url.removeprefix("unix:")) if url.startswith("unix:") else None
    base = url if own is None else "http://localhost"  # the Host header, over the socket
    client = ApplianceClient(base, token, timeout_s, actor=MQTT_ACTOR, unix_socket=own)
    return forwarding(client)


def forwarding(client: CommandClient) -> CommandDispatch:
    """The catalogue's commands, each done by the `client` call its entry names; the
    arguments are refused here as the gateway would refuse them."""
    return CommandDispatch(lambda command, args: _forward(client, command, args))


def _forward(client: CommandClient, command: Command[Any], args: BaseModel) -> Answer:
    """The command as the gateway ran it, in the answer one process gives; the API's
    refusal as KeyError (404: an unknown stream) or ValueError, which the sender hears."""
    try:
        return command.forward(client, args)
    except ApplianceAPIError as exc:
        raise (KeyError if exc.status == 404 else ValueError)(exc.message) from None
    except ApplianceClientError as exc:  # the gateway did not answer: stopping, or gone
        raise ValueError(f"the appliance's API did not answer: {exc}") from None
