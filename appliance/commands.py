"""Commands that arrive through a sink (MQTT's `<prefix>/cmd/...`), carried out by the
runtime. They run on the sinks loop; the work leaves it for a thread. KeyError (an
unknown stream) and ValueError (bad arguments, a refusal) are answered to the sender as
errors; nothing else is affected."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

from appliance.errors import WindowBusyError
from appliance.status import as_json

if TYPE_CHECKING:  # the runtime imports this module to hand `command` to its outputs
    from appliance.runtime import Runtime


async def command(runtime: Runtime, name: str, args: dict[str, Any]) -> dict[str, Any]:
    """`restart` {"stream": id} or `profiling` {"duration_s", "streams", "ort_operators"}."""
    loop = asyncio.get_running_loop()
    if name == "restart":
        stream = await loop.run_in_executor(None, runtime.restart_stream, stream_id(args))
        return {"stream": stream.id, "state": runtime.stream_status(stream.id).state}
    if name == "profiling":
        return await loop.run_in_executor(None, _profile, runtime, args)
    raise unknown_command(name)


def unknown_command(name: str) -> ValueError:
    return ValueError(f"unknown command {name!r} (known: restart, profiling)")


def stream_id(args: dict[str, Any]) -> str:
    """`restart`'s stream id; ValueError (answered to the sender) when it is not one."""
    value = args.get("stream")
    if not isinstance(value, str):
        raise ValueError("stream: a stream id")
    return value


def profiling_args(args: dict[str, Any]) -> tuple[float, list[str] | None, bool]:
    """`profiling`'s (duration_s, streams, ort_operators), checked; ValueError if not."""
    duration, streams = args.get("duration_s", 10.0), args.get("streams")
    if isinstance(duration, bool) or not isinstance(duration, int | float):
        raise ValueError("duration_s: a number of seconds")
    if streams is not None and not (
        isinstance(streams, list) and all(isinstance(s, str) for s in streams)
    ):
        raise ValueError("streams: a list of stream ids")
    return float(duration), streams, bool(args.get("ort_operators"))


def _profile(runtime: Runtime, args: dict[str, Any]) -> dict[str, Any]:
    try:
        window = runtime.start_profiling(*profiling_args(args))
        return as_json(window)  # type: ignore[no-any-return]
    except WindowBusyError as exc:  # a refusal the sender should hear about
        raise ValueError(str(exc)) from None
