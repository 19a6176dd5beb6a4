"""Commands that arrive through a sink (MQTT's `<prefix>/cmd/...`), carried out by the
runtime. They run on the sinks loop; the work leaves it for a thread. KeyError (an
unknown stream) and ValueError (bad arguments, a refusal) are answered to the sender as
errors; nothing else is affected.

A command's arguments are the body of the HTTP route that does the same, validated by
the same model the same way (strict: `"yes"` is not `true`, unknown fields refused), so
what one accepts the other accepts: `profiling` is POST /v1/profiling's ProfilingRequest;
`restart` takes the stream from its topic, as POST /v1/streams/{id}/restart from its path,
and, as that route does, reads nothing from the body.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

from pydantic import ValidationError

from appliance.errors import WindowBusyError
from appliance.observe.status import as_json
from appliance.server.schemas import ProfilingRequest
from pipelines.errors import format_location, pydantic_message

if TYPE_CHECKING:  # the runtime imports this module to hand `command` to its outputs
    from appliance.runtime.runtime import Runtime


async def command(runtime: Runtime, name: str, args: dict[str, Any]) -> dict[str, Any]:
    """`restart` {"stream": id} or `profiling` (ProfilingRequest's fields)."""
    loop = asyncio.get_running_loop()
    if name == "restart":
        stream = await loop.run_in_executor(None, runtime.restart_stream, stream_id(args))
        return {"stream": stream.id, "state": runtime.stream_status(stream.id).state}
    if name == "profiling":
        return await loop.run_in_executor(None, _profile, runtime, profiling_request(args))
    raise unknown_command(name)


def unknown_command(name: str) -> ValueError:
    return ValueError(f"unknown command {name!r} (known: restart, profiling)")


def stream_id(args: dict[str, Any]) -> str:
    """`restart`'s stream id; ValueError (answered to the sender) when it is not one."""
    value = args.get("stream")
    if not isinstance(value, str):
        raise ValueError("stream: a stream id")
    return value


def profiling_request(args: dict[str, Any]) -> ProfilingRequest:
    """`profiling`'s arguments as POST /v1/profiling's body; ValueError listing every
    problem as `location: message` (as the route's 422 details do) if they are not one.
    The window checks `duration_s` against profiling.max_window_s for both."""
    try:
        return ProfilingRequest.model_validate(args, strict=True)
    except ValidationError as exc:
        problems = [f"{format_location(e['loc'])}: {pydantic_message(e)}" for e in exc.errors()]
        raise ValueError("; ".join(problems)) from None


def _profile(runtime: Runtime, request: ProfilingRequest) -> dict[str, Any]:
    streams = list(request.streams) if request.streams is not None else None
    try:
        window = runtime.start_profiling(request.duration_s, streams, request.ort_operators)
        return as_json(window)  # type: ignore[no-any-return]
    except WindowBusyError as exc:  # a refusal the sender should hear about
        raise ValueError(str(exc)) from None
