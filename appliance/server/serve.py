"""`appliance serve`: the process lifecycle, top to bottom (uvicorn's server.py shape).

refuse an exposed bind without a token → startup (runtime, then HTTP) → main loop
(periodic stats lines; SIGHUP reloads the config) → shutdown on SIGINT or SIGTERM: HTTP
closed, streams and models stopped within the grace period.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
from collections.abc import Mapping

from aiohttp import web

from appliance.config import ConfigError
from appliance.errors import ReloadError
from appliance.models.session import ModelLoadError
from appliance.runtime import Runtime
from appliance.server.app import build_app
from appliance.server.auth import AuthPolicy
from appliance.server.routes.config import reload_config
from pipelines.errors import WorkflowError

log = logging.getLogger("appliance.server")

SHUTDOWN_GRACE_S = 5.0  # every thread joined within this, or we say which did not
RELOAD_REFUSED = (ConfigError, WorkflowError, ModelLoadError, ReloadError)


class Server:
    """The runtime behind its HTTP app on one address. Building it applies the auth rule,
    so a refused bind has started nothing."""

    def __init__(
        self,
        runtime: Runtime,
        host: str,
        port: int,
        *,
        insecure: bool = False,
        environ: Mapping[str, str] = os.environ,
    ) -> None:
        self.runtime = runtime
        self.host = host
        policy = AuthPolicy.for_bind(
            runtime.config.server, host, insecure=insecure, environ=environ
        )
        self.app = build_app(runtime, policy)
        self._port = port
        self._runner = web.AppRunner(self.app, handle_signals=False)

    @property
    def port(self) -> int:
        """The bound port (the real one when asked for port 0)."""
        for address in self._runner.addresses:
            return int(address[1])
        return self._port

    async def startup(self) -> None:
        """Models and streams first (fail fast, nothing served), then the HTTP site."""
        await asyncio.get_running_loop().run_in_executor(None, self.runtime.start)
        await self._runner.setup()
        try:
            await web.TCPSite(self._runner, self.host, self._port).start()
        except OSError as exc:  # port in use, address not ours: the CLI prints it, exit 1
            where = f"{self.host}:{self._port}"
            raise ConfigError([f"server: cannot listen on {where}: {exc.strerror or exc}"],
                              "server") from exc  # fmt: skip
        log.info("serving on http://%s:%d (/docs lists the API)", self.host, self.port)

    async def shutdown(self) -> bool:
        """HTTP first (no new requests), then the runtime; True when every thread ended."""
        log.info("shutting down")
        await self._runner.cleanup()
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(None, self.runtime.stop, SHUTDOWN_GRACE_S)

    async def reload_logged(self, why: str) -> None:
        """A reload that is not a request (SIGHUP): its outcome goes to the log only."""
        try:
            summary = await reload_config(self.app)
        except RELOAD_REFUSED as exc:
            log.error("config reload (%s) refused, nothing changed: %s", why, exc)
        except Exception:  # a reload must never take the server down
            log.exception("config reload (%s) failed", why)
        else:
            log.info("config reloaded (%s): %s", why, summary)


async def serve(
    runtime: Runtime,
    host: str,
    port: int,
    *,
    stats_interval_s: float = 5.0,
    stop: asyncio.Event | None = None,
    insecure: bool = False,
) -> bool:
    """Run until `stop` is set or a signal arrives; True when shutdown was clean.

    ConfigError (before anything starts) when `host` is not loopback and there is no
    token, unless `insecure`."""
    server = Server(runtime, host, port, insecure=insecure)
    loop = asyncio.get_running_loop()
    stop = stop or asyncio.Event()
    reload_wanted = asyncio.Event()
    handlers = {signal.SIGINT: stop.set, signal.SIGTERM: stop.set, signal.SIGHUP: reload_wanted.set}
    for sig, flag in handlers.items():  # handlers only set flags
        loop.add_signal_handler(sig, flag)
    try:
        await server.startup()
        reloader = asyncio.create_task(_reload_on_flag(server, reload_wanted), name="sighup")
        try:
            await _main_loop(runtime, stop, stats_interval_s)
        finally:
            reloader.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await reloader
    finally:
        clean = await server.shutdown()
        for sig in handlers:
            loop.remove_signal_handler(sig)
    return clean


async def _reload_on_flag(server: Server, wanted: asyncio.Event) -> None:
    while True:
        await wanted.wait()
        wanted.clear()  # a SIGHUP during the reload asks for one more
        await server.reload_logged("SIGHUP")


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
