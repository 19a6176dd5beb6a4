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
        stream = await loop.run_in_executor(None, runtime.restart_stream, _stream_id(args))
        return {"stream": stream.id, "state": runtime.stream_status(stream.id).state}
    if name == "profiling":
        return await loop.run_in_executor(None, _profile, runtime, args)
    raise ValueError(f"unknown command {name!r} (known: restart, profiling)")


def _stream_id(args: dict[str, Any]) -> str:
    stream_id = args.get("stream")
    if not isinstance(stream_id, str):
        raise ValueError("stream: a stream id")
    return stream_id


def _profile(runtime: Runtime, args: dict[str, Any]) -> dict[str, Any]:
    duration, streams = args.get("duration_s", 10.0), args.get("streams")
    if isinstance(duration, bool) or not isinstance(duration, int | float):
        raise ValueError("duration_s: a number of seconds")
    if streams is not None and not (
        isinstance(streams, list) and all(isinstance(s, str) for s in streams)
    ):
        raise ValueError("streams: a list of stream ids")
    try:
        window = runtime.start_profiling(float(duration), streams, bool(args.get("ort_operators")))
        return as_json(window)  # type: ignore[no-any-return]
    except WindowBusyError as exc:  # a refusal the sender should hear about
        raise ValueError(str(exc)) from None
