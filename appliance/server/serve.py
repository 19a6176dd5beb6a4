"""`appliance serve`: the process lifecycle, top to bottom (uvicorn's server.py shape).

startup (runtime, then HTTP) → main loop (periodic stats lines) → shutdown on SIGINT or
SIGTERM: HTTP closed, streams and models stopped within the grace period.
"""

from __future__ import annotations

import asyncio
import logging
import signal

from aiohttp import web

from appliance.runtime import Runtime
from appliance.server.app import build_app

log = logging.getLogger("appliance.server")

SHUTDOWN_GRACE_S = 5.0  # every thread joined within this, or we say which did not


async def serve(
    runtime: Runtime,
    host: str,
    port: int,
    *,
    stats_interval_s: float = 5.0,
    stop: asyncio.Event | None = None,
    insecure: bool = False,
) -> bool:
    """Run until `stop` is set or a signal arrives; True when shutdown was clean."""
    loop = asyncio.get_running_loop()
    stop = stop or asyncio.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):  # handlers only set the flag
        loop.add_signal_handler(sig, stop.set)
    await loop.run_in_executor(None, runtime.start)
    runner = web.AppRunner(build_app(runtime), handle_signals=False)
    await runner.setup()
    try:
        await web.TCPSite(runner, host, port).start()
        log.info("serving on http://%s:%d (/health, /ready, /metrics, /v1/streams)", host, port)
        await _main_loop(runtime, stop, stats_interval_s)
    finally:
        log.info("shutting down")
        await runner.cleanup()
        clean = await loop.run_in_executor(None, runtime.stop, SHUTDOWN_GRACE_S)
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(sig)
    return clean


async def _main_loop(runtime: Runtime, stop: asyncio.Event, interval_s: float) -> None:
    while not stop.is_set():
        try:
            await asyncio.wait_for(stop.wait(), interval_s)
        except TimeoutError:
            runtime.sync_metrics()
            for stream in list(runtime.streams.values()):
                log.info("%s", stream_line(stream.id, stream.summary()))


def stream_line(stream_id: str, s: dict[str, object]) -> str:
    """`cam1 running: 14.9 fps (source 15.0), 120 processed, 3 dropped, age p50 41 ms`."""
    lat = s["latency_ms"]
    p50 = lat.get("p50") if isinstance(lat, dict) else None
    age = f"{p50:.0f} ms" if isinstance(p50, float) else "-"
    return (
        f"{stream_id} {s['state']}: {s['fps']} fps (source {s['source_fps']}), "
        f"{s['frames_processed']} processed, {s['frames_dropped']} dropped, age p50 {age}"
    )
