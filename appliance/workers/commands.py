"""MQTT commands under `serve --workers`: one answer per command, as one process gives.

Every worker shares the config, so every worker's MQTT sink would take `<prefix>/cmd/...`:
a restart would be done by the stream's worker and refused by the others, a profiling
window opened in each. Instead worker 0 alone subscribes, and hands each command to the
gateway's API, which runs it where it belongs: a restart on the stream's worker, a
profiling window in every worker that runs a traced stream, merged under one id. The
other workers leave commands off (`Outputs(take_commands=False)`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

from appliance.client import ApplianceAPIError, ApplianceClient, ApplianceClientError
from appliance.config import AppConfig
from appliance.observe.status import as_json
from appliance.runtime.commands import profiling_request, stream_id, unknown_command
from appliance.server.auth import TOKEN_ENV
from sinks.mqtt.commands import CommandHandler


def worker_commands(
    index: int, gateway: str | None, config: AppConfig, environ: Mapping[str, str]
) -> tuple[CommandHandler | None, bool]:
    """(handler, take commands) for worker `index`: worker 0 hands them to the gateway at
    `gateway`, with the API token the gateway checks (the same config and environment);
    the others take none."""
    if index != 0 or gateway is None:
        return None, False
    token = environ.get(TOKEN_ENV) or config.server.token
    return gateway_commands(gateway, token, config.limits.request_timeout_s), True


def gateway_commands(url: str, token: str | None, timeout_s: float) -> CommandHandler:
    """A command handler that runs each command through the gateway's API at `url`."""
    client = ApplianceClient(url, token, timeout_s)

    async def handle(name: str, args: dict[str, Any]) -> dict[str, Any]:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(None, _forward, client, name, args)

    return handle


def _forward(client: ApplianceClient, name: str, args: dict[str, Any]) -> dict[str, Any]:
    """The command as the gateway ran it, in the answer one process gives; the API's
    refusal as KeyError (404: an unknown stream) or ValueError, which the sender hears."""
    try:
        if name == "restart":
            stream = client.restart_stream(stream_id(args))
            return {"stream": stream.id, "state": stream.state}
        if name == "profiling":
            body = profiling_request(args)  # refused here as the gateway would refuse it
            window = client.start_profiling(body.duration_s, body.streams, body.ort_operators)
            return as_json(window)  # type: ignore[no-any-return]
    except ApplianceAPIError as exc:
        raise (KeyError if exc.status == 404 else ValueError)(exc.message) from None
    except ApplianceClientError as exc:  # the gateway did not answer: stopping, or gone
        raise ValueError(f"the appliance's API did not answer: {exc}") from None
    raise unknown_command(name)
